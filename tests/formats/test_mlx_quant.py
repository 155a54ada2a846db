"""MLX's affine quantization against mlx itself: unpacking, dequantization bit for bit
in every bits / group size / scale dtype mlx-lm writes, and the quantizer of
`orion convert` against mx.quantize."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import ModelLoadError
from orion.formats import mlx_quant as M

mx = pytest.importorskip("mlx.core")

DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


def _mlx_quantized(rng, dtype: str, bits: int, group: int, shape=(8, 256)):
    w = mx.array((rng.standard_normal(shape) * 0.05).astype(np.float32))
    w = w.astype(getattr(mx, DTYPES[dtype]))
    wq, s, b = mx.quantize(w, group_size=group, bits=bits)
    ref = mx.dequantize(wq, s, b, group_size=group, bits=bits).astype(mx.float32)
    return (np.array(wq), np.array(s.astype(mx.float32)), np.array(b.astype(mx.float32)),
            np.array(ref))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("bits", M.BITS)
@pytest.mark.parametrize("group", M.GROUP_SIZES)
def test_dequantize_equals_mlx_bit_for_bit(dtype, bits, group):
    rng = np.random.default_rng(bits * 1000 + group)
    wq, s, b, ref = _mlx_quantized(rng, dtype, bits, group)
    codes = M.unpack(wq, bits, 256)
    assert codes.max() < 1 << bits
    np.testing.assert_array_equal(M.pack(codes, bits), wq)
    ours = M.dequantize(codes, s, b, group, dtype).astype(np.float32)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))
    # the device's fp16: mlx's values rounded once more (fp16 scales: already fp16)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(M.dequantize_fp16(codes, s, b, group, dtype),
                                      ref.astype(np.float16))


@pytest.mark.parametrize("bits", M.BITS)
@pytest.mark.parametrize("group", M.GROUP_SIZES)
def test_quantize_equals_mx_quantize(bits, group):
    w = (np.random.default_rng(bits + group).standard_normal((8, 256)) * 0.05).astype(
        np.float32)
    w[0, :group] = 0.0                      # a group of zeros: scale eps, bias 0
    wq, s, b = mx.quantize(mx.array(w), group_size=group, bits=bits)
    ours = M.quantize(w, M.QuantSpec(bits, group))
    for got, want in zip(ours, (wq, s, b), strict=True):
        np.testing.assert_array_equal(got, np.array(want))


def test_config_overrides_and_refusals():
    cfg = M.QuantConfig.read({"quantization": {
        "group_size": 64, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8},
        "lm_head": False}}, "config.json")
    assert cfg is not None
    assert cfg.spec("model.layers.0.mlp.up_proj") == M.QuantSpec(4, 64)
    assert cfg.spec("model.embed_tokens") == M.QuantSpec(8, 32)
    assert cfg.spec("lm_head") is None
    assert M.QuantConfig.read({"quantization": cfg.to_json()}, "c") == cfg
    assert M.QuantConfig.read({}, "c") is None
    for bad, word in [({"group_size": 64, "bits": 7}, "bits 7"),
                      ({"group_size": 48, "bits": 4}, "group_size 48"),
                      ({"group_size": 32, "bits": 4, "mode": "mxfp4"}, "mxfp4"),
                      ({"group_size": 64, "bits": 4, "x": 3}, "x")]:
        with pytest.raises(ModelLoadError, match=word):
            M.QuantConfig.read({"quantization": bad}, "config.json")
