"""fp32 -> float32/float16/bfloat16 safetensors bytes, read back by safetensors.torch, with
bf16 rounding compared to torch's own conversion."""

from __future__ import annotations

import numpy as np
import pytest

from orion.formats.safetensors import bf16_bits, save


def test_bf16_rounding_equals_torch_including_ties_and_extremes():
    torch = pytest.importorskip("torch", reason="torch (test extra) is the reference")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-80, 80, 200_000))).astype(np.float32)
    ties = [0x3F808000, 0x3F818000, 0x00018000, 0x80008000, 0x7F7FFFFF, 0x7F7F8000]
    x[:len(ties)] = np.array(ties, np.uint32).view(np.float32)
    x[10:13] = [np.inf, -np.inf, -0.0]
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_bits(x), ref)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_saved_bytes_load_in_safetensors_torch_as_that_dtype(dtype):
    torch = pytest.importorskip("torch", reason="torch (test extra) is the reference")
    from safetensors.torch import load

    rng = np.random.default_rng(1)
    w = {"a.weight": rng.standard_normal((3, 5)).astype(np.float32),
         "b": rng.standard_normal(7).astype(np.float32)}
    got = load(save(w, dtype, metadata={"format": "pt"}))
    for k, v in w.items():
        expect = torch.from_numpy(v).to(getattr(torch, dtype))
        assert got[k].dtype == expect.dtype and torch.equal(got[k], expect), k


def test_an_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="int8"):
        save({"a": np.zeros(2, np.float32)}, "int8")
