"""The GGML tensor types Orion reads from GGUF files, and their dequantization.

Each type stores rows of blocks; a block of `block` values takes `nbytes` bytes:

    F32, F16, BF16   1 value, 4 / 2 / 2 bytes
    Q8_0   32 values: fp16 d, 32 int8 q                           w = d * q
    Q4_0   32 values: fp16 d, 16 bytes of nibbles (value j in the low nibble of byte
           j, value j + 16 in its high nibble)                    w = d * (q - 8)
    Q4_K   256 values: fp16 d, fp16 dmin, 12 bytes holding 8 six-bit (scale, min) pairs,
           128 bytes of nibbles (each 64 values: 32 low nibbles, then 32 high)
                                                                  w = (d * sc) * q - dmin * m
    Q6_K   256 values: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales
           (one per 16 values), fp16 d                            w = (d * sc) * (q - 32)

`dequantize` computes in fp32 with the operations in the order gguf-py's dequantizers
use (its `gguf.quants`), so its values are those bit for bit; the device holds them
rounded once to fp16. Every other type is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orion.errors import ModelLoadError


@dataclass(frozen=True)
class GGMLType:
    name: str
    code: int       # the type id a GGUF tensor header holds
    block: int      # values a block holds
    nbytes: int     # bytes of one block


TYPES = {t.code: t for t in (
    GGMLType("F32", 0, 1, 4),
    GGMLType("F16", 1, 1, 2),
    GGMLType("Q4_0", 2, 32, 18),
    GGMLType("Q8_0", 8, 32, 34),
    GGMLType("Q4_K", 12, 256, 144),
    GGMLType("Q6_K", 14, 256, 210),
    GGMLType("BF16", 30, 1, 2),
)}
BY_NAME = {t.name: t for t in TYPES.values()}
# the names of the types Orion does not read, for the refusal (ggml's numbering)
OTHER_NAMES = {3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K",
               13: "Q5_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
               19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
               24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
               34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


def ggml_type(code: int, where: str) -> GGMLType:
    """The type of a tensor header's code, or a ModelLoadError naming the type."""
    t = TYPES.get(code)
    if t is None:
        name = OTHER_NAMES.get(code, f"type {code}")
        raise ModelLoadError(f"{where}: tensor type {name} is not supported (Orion reads "
                             f"{', '.join(sorted(BY_NAME))})")
    return t


def row_bytes(t: GGMLType, cols: int, where: str) -> int:
    if cols % t.block:
        raise ModelLoadError(f"{where}: a row of {cols} values is not whole {t.name} "
                             f"blocks of {t.block}")
    return cols // t.block * t.nbytes


def _fp16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def q4_k_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of Q4_K blocks from their 12 bytes [n, 12]: bytes
    0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7, bytes 4-7 mins 0-3
    likewise, bytes 8-11 the low nibbles of scales 4-7 (low) and mins 4-7 (high)."""
    p = packed.reshape(-1, 3, 4)
    d, m, md = p[:, 0], p[:, 1], p[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def q4_0_codes(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] codes 0..15 in value order."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def q4_k_codes(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 256] codes 0..15 in value order."""
    q = qs.reshape(-1, 4, 32)
    return np.stack([q & 0x0F, q >> 4], axis=2).reshape(-1, 256)


def q6_k_codes(ql: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """[n, 128] low nibbles and [n, 64] high bits -> [n, 256] codes 0..63 in value order
    (each 128 values: 64 bytes of ql, low then high nibbles, and 32 bytes of qh, 2 bits
    each for the four 32-value quarters)."""
    lo = ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    lo = (lo & 0x0F).reshape(-1, 8, 32)
    hi = qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    hi = (hi & 0x03).reshape(-1, 8, 32)
    return (lo | (hi << 4)).reshape(-1, 256)


def split_blocks(t: GGMLType, raw: np.ndarray) -> np.ndarray:
    """The bytes as [blocks, nbytes]."""
    return np.ascontiguousarray(raw).view(np.uint8).reshape(-1, t.nbytes)


def dequantize(t: GGMLType, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """fp32 values of `shape` (row-major, the last axis the GGUF row) from the raw bytes."""
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if t.name == "F32":
        out = raw.view("<f4").astype(np.float32)
    elif t.name == "F16":
        out = raw.view("<f2").astype(np.float32)
    elif t.name == "BF16":
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        blocks = split_blocks(t, raw)
        out = _DEQUANT[t.name](blocks)
    return out.reshape(shape)


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _fp16(b[:, :2])
    return (b[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _fp16(b[:, :2])
    q = (q4_0_codes(b[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32)
    return (d * q).reshape(-1)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _fp16(b[:, 0:2]), _fp16(b[:, 2:4])
    sc, mn = q4_k_scale_min(b[:, 4:16])
    scale = (d * sc.astype(np.float32)).reshape(-1, 8, 1)
    shift = (dmin * mn.astype(np.float32)).reshape(-1, 8, 1)
    q = q4_k_codes(b[:, 16:]).reshape(-1, 8, 32).astype(np.float32)
    return (scale * q - shift).reshape(-1)


def _q6_k(b: np.ndarray) -> np.ndarray:
    q = (q6_k_codes(b[:, :128], b[:, 128:192]).astype(np.int8) - np.int8(32))
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _fp16(b[:, 208:210])
    scale = (d * sc).reshape(-1, 16, 1)
    return (scale * q.reshape(-1, 16, 16).astype(np.float32)).reshape(-1)


_DEQUANT = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_K": _q4_k, "Q6_K": _q6_k}


def value_bound(t: GGMLType, raw: np.ndarray) -> float:
    """The largest |w| the bytes can dequantize to (inf if a scale or value is not
    finite), from the block scales alone: |d| 128 for Q8_0, |d| 8 for Q4_0,
    |d sc| 15 + |dmin m| for Q4_K, |d sc| 32 for Q6_K."""
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.size == 0:
        return 0.0
    if t.name in ("F32", "F16", "BF16"):
        v = dequantize(t, raw, (-1,))
        return float(np.max(np.abs(v))) if np.all(np.isfinite(v)) else float("inf")
    b = split_blocks(t, raw)
    with np.errstate(over="ignore", invalid="ignore"):
        if t.name == "Q8_0":
            bound = np.abs(_fp16(b[:, :2])) * 128
        elif t.name == "Q4_0":
            bound = np.abs(_fp16(b[:, :2])) * 8
        elif t.name == "Q4_K":
            sc, mn = q4_k_scale_min(b[:, 4:16])
            bound = (np.abs(_fp16(b[:, 0:2])) * sc * 15 + np.abs(_fp16(b[:, 2:4])) * mn)
        else:
            sc = np.abs(b[:, 192:208].view(np.int8).astype(np.float32))
            bound = np.abs(_fp16(b[:, 208:210])) * sc * 32
        worst = float(np.max(bound))
    return worst if np.isfinite(worst) else float("inf")
