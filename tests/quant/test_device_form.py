"""What the device holds against the reference dequantization, weight by weight.

The constexpr op computes fp16(scale * fp16(code - offset)) with fp16 scale and offset
(orion.models.quantized). Q8_0, Q4_0 and MLX's 2- and 3-bit tables fit that form
exactly: the device's weights are the reference's (gguf-py's, mx.dequantize's) rounded
to fp16, bit for bit. MLX affine s q + b, Q4_K's (d sc) q - dmin m and Q6_K's d sc
round a scale or an offset to fp16 once more: those weights may differ from the
reference's fp16, and the difference is measured here (printed under pytest -s, the
figures docs/quantization.md quotes) and bounded: at most 16 fp16 ulps of the block's
largest |w| and a tenth of the block's quantization step (an error in the form, a
wrong offset or scale, moves weights by whole steps)."""

from __future__ import annotations

import numpy as np
import pytest

from orion.models.registry import open_gguf_file, open_hf
from quant.gguf_writer import write_gguf

pytestmark = pytest.mark.native
ULP = 2.0 ** -10          # an fp16 ulp at 1.0


def _compare(weights, names, block: int, levels: int) -> tuple[float, float, float]:
    """(fraction of weights that differ, max |device - reference| in fp16 ulps of its
    block's largest |w|, max in quantization steps of the block) over `names`."""
    differ = total = 0
    worst_ulps = worst_steps = 0.0
    for name in names:
        q = weights.quant(name)
        assert q is not None, name
        dev = q.dense().astype(np.float32)
        ref = weights.fp16(name).astype(np.float32)
        d = np.abs(dev - ref).reshape(ref.shape[0], -1, block)
        r = ref.reshape(d.shape)
        top = np.abs(r).max(axis=-1, keepdims=True)
        step = (r.max(axis=-1, keepdims=True) - r.min(axis=-1, keepdims=True)) / levels
        ulp = np.exp2(np.floor(np.log2(np.where(top > 0, top, 1)))) * ULP
        differ += int(np.count_nonzero(d))
        total += d.size
        worst_ulps = max(worst_ulps, float((d / ulp).max()))
        worst_steps = max(worst_steps, float((d / np.where(step > 0, step, 1)).max()))
    return differ / total, worst_ulps, worst_steps


def _report(label: str, figures: tuple[float, float, float]) -> None:
    frac, ulps, steps = figures
    print(f"{label}: {frac:.2%} of weights differ from the reference fp16; max "
          f"{ulps:.2f} fp16 ulps of the block's largest |w| ({steps:.4f} steps)")


def test_mlx_4bit_device_form(qwen3_mlx4):
    arch, weights = open_hf(qwen3_mlx4)
    try:
        names = [n for n in weights.names() if weights.module(n) is not None]
        figures = _compare(weights, names, 64, 15)
    finally:
        weights.close()
    _report("MLX 4-bit g64", figures)
    assert figures[1] <= 16 and figures[2] <= 0.1, figures


@pytest.mark.parametrize("qtype,exact", [("Q8_0", True), ("Q4_0", True), ("Q4_K", False),
                                         ("Q6_K", False)])
def test_gguf_device_form(llama_hf, tmp_path, qtype, exact):
    path = write_gguf(llama_hf, tmp_path / "m.gguf", qtype)
    arch, weights, _ = open_gguf_file(path)
    try:
        names = [n for n in weights.names() if weights.quant(n) is not None]
        assert names
        figures = _compare(weights, names, *((16, 63) if qtype == "Q6_K" else (32, 15)))
    finally:
        weights.close()
    _report(qtype, figures)
    if exact:
        assert figures[0] == 0, figures
    else:
        assert figures[1] <= 16 and figures[2] <= 0.1, figures
