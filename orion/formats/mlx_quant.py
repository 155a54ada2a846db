"""MLX's affine quantization, as `mlx.core.quantize` writes it and mlx-lm saves it.

A quantized linear layer (or embedding) `m` of weight [O, I] is stored as three tensors:

    m.weight   uint32 [O, I * bits / 32]   the codes, a little-endian bit stream per row,
                                           least significant bits first (8 codes of 4 bits
                                           in a word; 3-, 5- and 6-bit codes cross words)
    m.scales   [O, I / group_size]         one scale s and one bias b per group of
    m.biases   [O, I / group_size]         `group_size` consecutive inputs

and w = s * q + b. config.json says `"quantization": {"group_size": 64, "bits": 4}`, and
may override it per module path (`"model.embed_tokens": {"group_size": 32, "bits": 8}`)
or leave a module unquantized (`false`); mlx-lm quantizes exactly the modules whose
`scales` the weights hold.

`dequantize` gives what `mlx.core.dequantize` gives, bit for bit: in the scales' dtype,
each operation rounded to it (fp16(fp16(s * q) + b) for fp16 scales, likewise bf16).
The codes' bit stream is the device's sub-byte blob layout as well (coremltools packs
uint4 least significant bits first), so the words need no repacking to reach a blob.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from orion.errors import ModelLoadError

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)
# the scales' dtypes mlx-lm writes (bf16 as its uint16 bits, "BF16" in safetensors)
SCALE_DTYPES = ("F16", "BF16", "F32")


@dataclass(frozen=True)
class QuantSpec:
    """How one module is quantized."""

    bits: int
    group_size: int

    def words(self, cols: int) -> int:
        """uint32 words of one row of `cols` codes."""
        return cols * self.bits // 32


def _spec(value: object, where: str) -> QuantSpec:
    if not isinstance(value, dict):
        raise ModelLoadError(f"{where} must be an object with group_size and bits")
    mode = value.get("mode", "affine")
    if mode != "affine":
        raise ModelLoadError(f"{where}: mode {mode!r} is not supported (only MLX's "
                             "\"affine\" quantization: mxfp4, nvfp4 and mxfp8 are not)")
    bits, group = value.get("bits"), value.get("group_size")
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in BITS:
        raise ModelLoadError(f"{where}: bits {bits!r} is not one of {', '.join(map(str, BITS))}")
    if not isinstance(group, int) or isinstance(group, bool) or group not in GROUP_SIZES:
        raise ModelLoadError(f"{where}: group_size {group!r} is not one of "
                             f"{', '.join(map(str, GROUP_SIZES))}")
    return QuantSpec(bits, group)


@dataclass(frozen=True)
class QuantConfig:
    """config.json's "quantization": the default spec and the per-module overrides
    (None: that module is not quantized)."""

    default: QuantSpec
    overrides: Mapping[str, QuantSpec | None]

    @classmethod
    def read(cls, config: Mapping[str, object], where: str) -> QuantConfig | None:
        """The config's quantization (None when it has none); a malformed or unsupported
        one is a ModelLoadError naming the field."""
        q = config.get("quantization")
        if q is None:
            return None
        if not isinstance(q, dict):
            raise ModelLoadError(f"{where}: quantization must be an object")
        default = _spec(q, f"{where}: quantization")
        overrides: dict[str, QuantSpec | None] = {}
        for key, value in q.items():
            if key in ("group_size", "bits", "mode"):
                continue
            if value is False:
                overrides[key] = None
            elif isinstance(value, dict):
                overrides[key] = _spec(value, f"{where}: quantization[{key!r}]")
            else:
                raise ModelLoadError(f"{where}: quantization[{key!r}] must be an object "
                                     "or false")
        return cls(default, overrides)

    def spec(self, module: str) -> QuantSpec | None:
        """The spec of a module whose scales the weights hold."""
        return self.overrides.get(module, self.default)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"group_size": self.default.group_size,
                                  "bits": self.default.bits}
        for key, spec in self.overrides.items():
            out[key] = False if spec is None else {"group_size": spec.group_size,
                                                   "bits": spec.bits}
        return out


# ---- the codes' bit stream ------------------------------------------------------------


def unpack(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """uint8 codes [..., cols] from the packed rows [..., cols * bits / 32] (uint32 words,
    or their bytes)."""
    raw = np.ascontiguousarray(words).view(np.uint8)
    lead = raw.shape[:-1]
    raw = raw.reshape(-1, raw.shape[-1])
    if raw.shape[1] * 8 != cols * bits:
        raise ModelLoadError(f"{raw.shape[1]} bytes a row do not hold {cols} codes of "
                             f"{bits} bits")
    if bits in (2, 4, 8):
        per = 8 // bits
        shifts = (np.arange(per, dtype=np.uint8) * bits).reshape(1, 1, per)
        codes = (raw[:, :, None] >> shifts) & np.uint8((1 << bits) - 1)
        return codes.reshape(*lead, cols)
    # 3, 5, 6 bits: codes cross bytes; the stream's bits, least significant first
    stream = np.unpackbits(raw, axis=1, bitorder="little").reshape(raw.shape[0], cols, bits)
    weights = (1 << np.arange(bits, dtype=np.uint16)).astype(np.uint8)
    return (stream * weights).sum(axis=2, dtype=np.uint16).astype(np.uint8).reshape(
        *lead, cols)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of `unpack`: codes [..., cols] (each < 2^bits) as uint32 words."""
    codes = np.ascontiguousarray(codes, np.uint8)
    lead, cols = codes.shape[:-1], codes.shape[-1]
    if (cols * bits) % 32:
        raise ValueError(f"{cols} codes of {bits} bits are not whole uint32 words")
    flat = codes.reshape(-1, cols)
    if bits in (2, 4, 8):
        per = 8 // bits
        parts = flat.reshape(flat.shape[0], cols // per, per).astype(np.uint8)
        byte = np.zeros(parts.shape[:2], np.uint8)
        for i in range(per):
            byte |= parts[:, :, i] << np.uint8(i * bits)
    else:
        shifts = np.arange(bits, dtype=np.uint8)
        stream = ((flat[:, :, None] >> shifts) & 1).reshape(flat.shape[0], cols * bits)
        byte = np.packbits(stream, axis=1, bitorder="little")
    return byte.view("<u4").reshape(*lead, cols * bits // 32)


# ---- dequantization ---------------------------------------------------------------


def round_bf16(x: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16 (to nearest, ties to even), kept as fp32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def bf16_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def dequantize(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int,
               dtype: str) -> np.ndarray:
    """w = s * q + b as `mlx.core.dequantize` computes it in the scales' `dtype` ("F16",
    "BF16" or "F32"; bf16 scales and biases given as fp32 values): fp16 and fp32 results
    in their own dtype, bf16 results as fp32 holding bf16 values."""
    q = codes.astype(np.float32)
    s = np.repeat(np.asarray(scales, np.float32), group_size, axis=-1)
    b = np.repeat(np.asarray(biases, np.float32), group_size, axis=-1)
    if dtype == "F16":
        return ((s * q).astype(np.float16) + b.astype(np.float16)).astype(np.float16)
    if dtype == "BF16":
        return round_bf16(round_bf16(s * q) + b)
    return (s * q) + b


def dequantize_fp16(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray,
                    group_size: int, dtype: str) -> np.ndarray:
    """`dequantize` in the device's fp16 (a bf16 or fp32 result rounded once more)."""
    w = dequantize(codes, scales, biases, group_size, dtype)
    with np.errstate(over="ignore"):
        return w.astype(np.float16)


# ---- quantization (orion convert) ---------------------------------------------------


def quantize(w: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp32 w [O, I] -> (words uint32, scales fp32, biases fp32), MLX's affine rule: per
    group, the extreme of larger magnitude is represented exactly (the zero point lies
    on the grid), the other end of the range by the nearest code."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    if cols % spec.group_size:
        raise ValueError(f"{cols} columns are not whole groups of {spec.group_size}")
    g = w.reshape(rows, cols // spec.group_size, spec.group_size)
    n_bins = np.float32((1 << spec.bits) - 1)
    w_max, w_min = g.max(axis=2), g.min(axis=2)
    low = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7))
    scale = np.where(low, scale, -scale).astype(np.float32)
    edge = np.where(low, w_min, w_max)
    q0 = np.rint(edge / scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scale).astype(np.float32)
    bias = np.where(q0 == 0, np.float32(0), edge).astype(np.float32)
    codes = np.clip(np.rint((g - bias[:, :, None]) / scale[:, :, None]), 0, n_bins)
    codes = codes.astype(np.uint8).reshape(rows, cols)
    return pack(codes, spec.bits), scale, bias
