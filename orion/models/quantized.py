"""Each quantized format as the device holds it: a `QuantTensor` (orion.ir.quant), the
compressed const that one of MIL's constexpr ops expands at load.

    MLX affine, 4 / 5 / 6 / 8 bits   constexpr_blockwise_shift_scale: uint4 (or uint8)
                                     codes as stored, scale fp16(s), offset fp16(-b / s)
    MLX affine, 2 / 3 bits           constexpr_lut_to_dense: each group's 4 or 8 values
                                     (mx.dequantize's, in fp16) as its table
    GGUF Q8_0                        shift_scale: int8 codes, scale d per 32
    GGUF Q4_0                        shift_scale: int4 codes q - 8, scale d per 32
    GGUF Q4_K                        shift_scale: uint4 codes, scale fp16(d sc) and offset
                                     fp16(dmin m / scale) per 32
    GGUF Q6_K                        shift_scale: int8 codes q - 32, scale fp16(d sc) per 16

The device's op computes fp16(scale * fp16(code - offset)). Where the format's own
arithmetic has that form with fp16 numbers (Q8_0, Q4_0, the LUT of MLX's 2 and 3
bits) the device holds exactly the reference's values in fp16; elsewhere (MLX's
s q + b, Q4_K's and Q6_K's products of two scales) the scale or offset is rounded to
fp16 once more, an error below half a step of the weight's own fp16 rounding for
typical blocks (docs/quantization.md measures it). A block the form cannot hold at
all (a zero scale with a nonzero bias or min) makes its tensor a LUT, exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from orion.formats import gguf_quants as GQ
from orion.formats import mlx_quant as MQ
from orion.ir.quant import QuantTensor, pack_codes

ROWS_AT_ONCE = 4096
LUT_BITS = (1, 2, 3, 4, 6, 8)   # the index widths constexpr_lut_to_dense takes


def _fp16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, np.float32).astype(np.float16)


def _affine_form(scale: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(fp16 scale s, fp16 offset o) with s (q - o) ~ scale q - shift, or None where a
    block cannot be written so (a zero scale with a nonzero shift, an offset past fp16)."""
    s = _fp16(scale)
    s32 = s.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = _fp16(np.where(s32 != 0, shift / np.where(s32 != 0, s32, 1), 0))
    if np.any((s32 == 0) & (shift != 0)) or not np.all(np.isfinite(o)):
        return None
    return s, o


def _lut(values: np.ndarray, codes: np.ndarray, code_dtype: str, shape: tuple[int, int],
         ) -> QuantTensor:
    """A LUT tensor from each group's table `values` [rows, groups, 2^bits] (fp32)."""
    lut = _fp16(values)[..., None]
    return QuantTensor("lut", shape, pack_codes(codes, int(np.log2(values.shape[-1]))),
                       code_dtype, lut=lut)


# ---- MLX --------------------------------------------------------------------------


def mlx_tensor(words: np.ndarray, scales: np.ndarray, biases: np.ndarray,
               spec: MQ.QuantSpec, dtype: str, shape: tuple[int, int]) -> QuantTensor:
    """An MLX module (uint32 codes, scales, biases as fp32 values of `dtype`)."""
    rows, cols = shape
    raw = np.ascontiguousarray(words).view(np.uint8).reshape(rows, -1)
    form = None if spec.bits in (2, 3) else _affine_form(scales, -biases)
    if form is None:
        # 2 and 3 bits, or a group the shift-scale form cannot hold: each group's values
        # (mx.dequantize's) as its table, exact; indices of a width the op takes
        width = next(b for b in LUT_BITS if b >= spec.bits)
        k = np.arange(1 << width, dtype=np.uint8)
        table = MQ.dequantize(np.broadcast_to(k, (rows, cols // spec.group_size, k.size)),
                              scales[..., None], biases[..., None], 1, dtype)
        if width == spec.bits:
            return QuantTensor("lut", shape, raw.reshape(-1).copy(), f"uint{width}",
                               lut=_fp16(table)[..., None])
        return _lut(table, MQ.unpack(raw, spec.bits, cols), f"uint{width}", shape)
    s, o = form
    if spec.bits in (4, 8):
        codes = raw.reshape(-1).copy()
        code_dtype = f"uint{spec.bits}"
    else:                 # 5 and 6 bits: one byte a code (the op takes 4 or 8)
        codes = MQ.unpack(raw, spec.bits, cols).reshape(-1)
        code_dtype = "uint8"
    return QuantTensor("shift_scale", shape, codes, code_dtype, s, o)


# ---- GGUF -------------------------------------------------------------------------


def _chunks(read_rows: Callable[[np.ndarray], np.ndarray], rows: np.ndarray
            ) -> Iterator[tuple[int, np.ndarray]]:
    # one chunk read at a time: the whole tensor is never held (nor mapped) at once
    for lo in range(0, rows.size, ROWS_AT_ONCE):
        yield lo, read_rows(rows[lo: lo + ROWS_AT_ONCE])


def gguf_tensor(t: GQ.GGMLType, read_rows: Callable[[np.ndarray], np.ndarray],
                rows: np.ndarray, shape: tuple[int, int]) -> QuantTensor | None:
    """A GGUF matrix of type `t` as the device holds it; None for float types (fp16
    consts). `read_rows(stored rows)` gives their bytes [n, row bytes]; `rows` are the
    stored rows in parameter order."""
    if t.name in ("F32", "F16", "BF16"):
        return None
    n_rows, cols = shape
    per = 16 if t.name == "Q6_K" else 32
    codes = np.empty((n_rows, cols), np.int8)      # every type's codes fit a byte
    scale = np.empty((n_rows, cols // per), np.float32)
    shift = np.zeros((n_rows, cols // per), np.float32)
    for lo, part in _chunks(read_rows, rows):
        b = GQ.split_blocks(t, part)                      # [n * blocks a row, nbytes]
        n = part.shape[0]
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        if t.name == "Q8_0":
            c, sc = b[:, 2:].view(np.int8).astype(np.int16), d
        elif t.name == "Q4_0":
            c, sc = GQ.q4_0_codes(b[:, 2:]).astype(np.int16) - 8, d
        elif t.name == "Q4_K":
            dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
            s6, m6 = GQ.q4_k_scale_min(b[:, 4:16])
            c = GQ.q4_k_codes(b[:, 16:]).astype(np.int16)
            sc = d * s6.astype(np.float32)                 # [blocks, 8]: gguf-py's products
            shift[lo: lo + n] = (dmin * m6.astype(np.float32)).reshape(n, -1)
        else:   # Q6_K
            c = GQ.q6_k_codes(b[:, :128], b[:, 128:192]).astype(np.int16) - 32
            d = b[:, 208:210].copy().view(np.float16).astype(np.float32)
            sc = d * b[:, 192:208].view(np.int8).astype(np.float32)
        codes[lo: lo + n] = c.reshape(n, cols)
        scale[lo: lo + n] = sc.reshape(n, -1)
    if t.name in ("Q8_0", "Q6_K"):
        return QuantTensor("shift_scale", shape, pack_codes(codes, 8), "int8", _fp16(scale))
    if t.name == "Q4_0":
        return QuantTensor("shift_scale", shape, pack_codes(codes, 4), "int4", _fp16(scale))
    form = _affine_form(scale, shift)
    if form is None:     # exact: each 32's table of 16 values, as gguf-py computes them
        k = np.arange(16, dtype=np.float32)
        table = scale[..., None] * k - shift[..., None]
        return _lut(table, codes, "uint4", shape)
    return QuantTensor("shift_scale", shape, pack_codes(codes, 4), "uint4", *form)
