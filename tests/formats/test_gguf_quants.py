"""GGUF block types against gguf-py's dequantizers, bit for bit (fp32, and the
device's fp16), on random blocks; other types refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import ModelLoadError
from orion.formats import gguf_quants as G

gguf = pytest.importorskip("gguf")

SCALE_AT = {"Q8_0": (0,), "Q4_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_blocks(rng, name: str, n: int) -> np.ndarray:
    """n blocks of random bytes, their fp16 scales finite (as quantizers write them)."""
    t = G.BY_NAME[name]
    if name in ("F16", "BF16", "F32"):
        v = rng.standard_normal(n).astype(np.float32)
        stored = {"F32": v, "F16": v.astype(np.float16),
                  "BF16": (v.view(np.uint32) >> 16).astype(np.uint16)}[name]
        return np.frombuffer(stored.tobytes(), np.uint8).copy()
    b = rng.integers(0, 256, (n, t.nbytes), dtype=np.uint8)
    for at in SCALE_AT[name]:
        d = (rng.standard_normal(n) * 0.01).astype(np.float16)
        b[:, at:at + 2] = np.frombuffer(d.tobytes(), np.uint8).reshape(n, 2)
    return b.reshape(-1)


@pytest.mark.parametrize("name", sorted(G.BY_NAME))
def test_dequantize_equals_gguf_py(name):
    t = G.BY_NAME[name]
    rows, blocks = 6, 8
    raw = random_blocks(np.random.default_rng(t.code), name, rows * blocks)
    cols = blocks * t.block
    ours = G.dequantize(t, raw, (rows, cols))
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[name])
    ref = np.asarray(ref, np.float32)
    assert ref.shape == (rows, cols)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))
    np.testing.assert_array_equal(ours.astype(np.float16), ref.astype(np.float16))


def test_codes_in_value_order():
    rng = np.random.default_rng(3)
    raw = random_blocks(rng, "Q4_K", 4).reshape(4, -1)
    sc, mn = G.q4_k_scale_min(raw[:, 4:16])
    ref_sc, ref_mn = gguf.quants.Q4_K.get_scale_min(raw[:, 4:16])
    np.testing.assert_array_equal(sc, ref_sc)
    np.testing.assert_array_equal(mn, ref_mn)


def test_unsupported_types_are_refused_by_name():
    with pytest.raises(ModelLoadError, match="Q5_K is not supported"):
        G.ggml_type(13, "m.gguf: blk.0.ffn_up.weight")
    with pytest.raises(ModelLoadError, match="type 99"):
        G.ggml_type(99, "m.gguf")
    with pytest.raises(ModelLoadError, match="not whole Q4_K blocks"):
        G.row_bytes(G.BY_NAME["Q4_K"], 100, "m.gguf")
