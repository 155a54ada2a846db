"""Compressed weights in the graph: a const whose value the device computes at load
from compressed consts, by one of the constexpr ops of coremltools' MIL.

    QuantTensor("shift_scale", ...)  constexpr_blockwise_shift_scale (iOS18):
        w = fp16(scale * fp16(code - offset)), one scale (and offset) per block
    QuantTensor("lut", ...)          constexpr_lut_to_dense (iOS18): w = lut[block][code]
    QuantTensor("affine", ...)       constexpr_affine_dequantize (iOS16): per-channel int8

`dense()` is coremltools' reference `decompress` of each op (each operation rounded to
fp16), the value vane computes bit for bit. A palettized weight (ANE-C57) may carry a
`post_scale`, one fp16 value per output channel that the graph multiplies the product
by after the conv (`orion.models.blocks`): it is part of the weight's value (`dense()`
is fp16(lut value * scale)) but never of a const, which holds `unscaled()`.

A QuantTensor stands where a numpy array stands in a const node (`Graph.const`): it
has a shape, an fp16 dtype, and `astype` / `__array__` give the dense values (the IR's
reference interpreter, host fallbacks), while the MIL emitter (`orion.ir.mil`) writes
its parts as blob entries and the constexpr op. Codes are packed least significant
bits first, the device's sub-byte blob layout (and MLX's): element e's bits start at
bit e * bits of the stream.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from orion.errors import InvalidArgumentError

OPS = ("shift_scale", "lut", "affine")
CODE_BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8, "uint1": 1, "uint2": 2,
             "uint3": 3, "uint6": 6}
SIGNED = ("int4", "int8")
PACK_CHUNK = 1 << 18     # codes packed at a time by the bit-stream path


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (integers below 2^bits, or two's complement for signed ones) as the
    least-significant-bits-first byte stream. Temporaries stay one byte a code (4 and
    8 bits) or a chunk at a time: a classifier's codes are tens of millions."""
    c = np.ascontiguousarray(codes).reshape(-1)
    if bits == 8:
        return c.astype(np.uint8)             # integer casts wrap: the low byte
    if bits == 4:
        u = c.astype(np.uint8) & 0x0F
        if u.size % 2:
            u = np.concatenate([u, np.zeros(1, np.uint8)])
        return u[0::2] | (u[1::2] << 4)
    out = np.empty((c.size * bits + 7) // 8, np.uint8)
    step = PACK_CHUNK                          # a multiple of 8: each chunk whole bytes
    for lo in range(0, c.size, step):
        part = c[lo: lo + step].astype(np.int64) & ((1 << bits) - 1)
        stream = ((part[:, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(-1)
        packed = np.packbits(stream, bitorder="little")
        out[lo * bits // 8: lo * bits // 8 + packed.size] = packed
    return out


def unpack_codes(data: np.ndarray, bits: int, count: int, signed: bool) -> np.ndarray:
    """The inverse of `pack_codes`: `count` codes as int16 (sign-extended if `signed`)."""
    data = np.ascontiguousarray(data, np.uint8).reshape(-1)
    if bits == 8:
        out = data[:count].astype(np.int16)
    elif bits == 4:
        out = np.stack([data & 0x0F, data >> 4], axis=1).reshape(-1)[:count].astype(np.int16)
    else:
        stream = np.unpackbits(data, bitorder="little")[: count * bits].reshape(count, bits)
        out = (stream.astype(np.int16) << np.arange(bits, dtype=np.int16)).sum(
            axis=1, dtype=np.int16)
    if signed:
        out = np.where(out >= 1 << (bits - 1), out - (1 << bits), out).astype(np.int16)
    return out


def _r16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


@dataclass(frozen=True, eq=False)
class QuantTensor:
    """A compressed weight (see the module docstring). `grid` arrays (scale, offset,
    lut's leading dims) have the weight's rank, each dim dividing the weight's;
    affine's scale and zero point are scalars or one value per index of `axis`."""

    op: str
    shape: tuple[int, ...]
    codes: np.ndarray            # uint8 packed stream (uint8 / int8 for 8-bit)
    code_dtype: str              # a key of CODE_BITS
    scale: np.ndarray | None = None     # fp16
    offset: np.ndarray | None = None    # fp16 (shift_scale); affine: the zero point (codes)
    lut: np.ndarray | None = None       # fp16 [grid..., 2^bits, 1]
    axis: int = 0
    post_scale: np.ndarray | None = None  # fp16 [shape[0]]: times the product, after it
    _dense: list[np.ndarray] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.op not in OPS or self.code_dtype not in CODE_BITS:
            raise InvalidArgumentError(f"QuantTensor: op {self.op!r} / codes "
                                       f"{self.code_dtype!r} is not one of {OPS} / "
                                       f"{sorted(CODE_BITS)}")
        want = (self.size * self.bits + 7) // 8
        if self.codes.dtype.itemsize != 1 or self.codes.size != want:
            raise InvalidArgumentError(f"QuantTensor: {self.codes.size} bytes of codes for "
                                       f"{self.size} codes of {self.bits} bits ({want} needed)")
        for name in ("scale", "lut") + (("offset",) if self.op == "shift_scale" else ()):
            v = getattr(self, name)
            if v is not None and (v.dtype != np.float16 or not np.all(np.isfinite(v))):
                raise InvalidArgumentError(f"QuantTensor: {name} must hold finite fp16 values")
        p = self.post_scale
        if p is not None and (p.dtype != np.float16 or p.shape != self.shape[:1]
                              or not np.all(np.isfinite(p))):
            raise InvalidArgumentError(f"QuantTensor: post_scale must be {self.shape[0]} "
                                       "finite fp16 values, one per output channel")
        grid = self.lut.shape[:-2] if self.op == "lut" else \
            self.scale.shape if self.op == "shift_scale" else None  # type: ignore[union-attr]
        if grid is not None and (len(grid) != len(self.shape) or any(
                g < 1 or d % g for d, g in zip(self.shape, grid, strict=True))):
            raise InvalidArgumentError(f"QuantTensor: blocks {list(grid)} do not tile "
                                       f"{list(self.shape)}")

    # ---- what a const's value offers ----------------------------------------------

    @property
    def bits(self) -> int:
        return CODE_BITS[self.code_dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float16)

    @property
    def nbytes(self) -> int:
        """Bytes the device holds: codes, scales, offsets, tables."""
        parts = (self.codes, self.scale, self.offset, self.lut, self.post_scale)
        return sum(int(p.nbytes) for p in parts if p is not None)

    def setflags(self, write: bool) -> None:
        """Already read-only (a frozen array's interface)."""

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        d = self.dense()
        return d if dtype is None else d.astype(dtype)

    def astype(self, dtype: object, copy: bool = True) -> np.ndarray:
        return self.dense().astype(dtype)

    def digest(self) -> bytes:
        """Equal digests: equal parts (the emitter stores equal weights once)."""
        h = hashlib.sha256(f"{self.op}|{self.shape}|{self.code_dtype}|{self.axis}".encode())
        for p in (self.codes, self.scale, self.offset, self.lut, self.post_scale):
            h.update(b"|" if p is None else np.ascontiguousarray(p).tobytes())
        return h.digest()

    # ---- the values (coremltools' decompress) ------------------------------------

    def codes_array(self) -> np.ndarray:
        """The codes as int16 in the weight's shape."""
        c = unpack_codes(self.codes, self.bits, self.size, self.code_dtype in SIGNED)
        return c.reshape(self.shape)

    def dense(self) -> np.ndarray:
        """The fp16 weight, computed once and kept (a host fallback reads it)."""
        if self._dense:
            return self._dense[0]
        q = self.codes_array()
        if self.op == "lut":
            lut = self.lut.astype(np.float32)  # type: ignore[union-attr]
            entries = lut.shape[-2]
            grid = lut.reshape(*lut.shape[:-2], entries)
            idx = tuple(np.repeat(np.arange(g), d // g).reshape(
                [-1 if a == i else 1 for a in range(len(self.shape))])
                for i, (d, g) in enumerate(zip(self.shape, grid.shape[:-1], strict=True)))
            out = grid[(*idx, q.astype(np.int64))].astype(np.float16)
        else:
            s = self._expand(self.scale)
            o = self._expand(self.offset) if self.offset is not None else np.float32(0)
            if self.op == "shift_scale":
                out = _r16(s * _r16(q.astype(np.float32) - o)).astype(np.float16)
            else:
                with np.errstate(over="ignore"):
                    out = (s * (q.astype(np.float32) - o)).astype(np.float16)
        if self.post_scale is not None:     # one rounding of the product, as the host's
            post = self.post_scale.astype(np.float32).reshape(-1, *[1] * (self.ndim - 1))
            out = (out.astype(np.float32) * post).astype(np.float16)
        out.setflags(write=False)
        self._dense.append(out)
        return out

    def _expand(self, a: np.ndarray | None) -> np.ndarray:
        a = np.asarray(a, np.float32)
        if self.op == "affine":
            if a.ndim == 0:
                return a
            shape = [1] * len(self.shape)
            shape[self.axis] = -1
            return a.reshape(shape)
        for axis, (d, g) in enumerate(zip(self.shape, a.shape, strict=True)):
            if g != d:
                a = np.repeat(a, d // g, axis=axis)
        return a

    # ---- reshapes the compiler makes ----------------------------------------------

    def with_shape(self, shape: tuple[int, ...]) -> QuantTensor:
        """The same weight with trailing dims of 1 added or removed ([O, I] <-> [O, I,
        1, 1]); the codes stay as they are (the element order does not change)."""
        shape = tuple(shape)
        core = tuple(self.shape[:2]) if len(self.shape) >= 2 else self.shape
        if shape[:len(core)] != core or any(d != 1 for d in shape[len(core):]) or any(
                d != 1 for d in self.shape[len(core):]):
            raise InvalidArgumentError(f"QuantTensor {list(self.shape)} cannot become "
                                       f"{list(shape)}")

        def grid(a: np.ndarray | None, lead: int) -> np.ndarray | None:
            if a is None or self.op == "affine":
                return a
            tail = a.shape[len(self.shape):]
            return a.reshape(*a.shape[:len(core)], *([1] * (len(shape) - len(core))), *tail) \
                if lead else a

        return QuantTensor(self.op, shape, self.codes, self.code_dtype, grid(self.scale, 1),
                           grid(self.offset, 1), grid(self.lut, 1), self.axis, self.post_scale)

    def unscaled(self) -> QuantTensor:
        """The weight without its post_scale: what a const holds (the product is then
        multiplied by `post_scale`)."""
        return QuantTensor(self.op, self.shape, self.codes, self.code_dtype, self.scale,
                           self.offset, self.lut, self.axis)

    def transposed(self) -> QuantTensor:
        """W^T of a matrix ([O, I, 1, 1] -> [I, O, 1, 1] too), exactly: each block
        moves with its elements (training's backward reads W^T). A post_scale (per
        output channel) would scale W^T's columns: not a weight the op can hold."""
        if self.post_scale is not None:
            raise InvalidArgumentError("QuantTensor: a weight with a post_scale cannot be "
                                       "transposed; transpose unscaled() and scale the input")
        lead = self.shape[:2]
        rest = self.shape[2:]
        q = self.codes_array().reshape(lead).T
        codes = pack_codes(q, self.bits)

        def t(a: np.ndarray | None) -> np.ndarray | None:
            if a is None:
                return None
            if self.op == "affine":
                return a
            return np.ascontiguousarray(np.swapaxes(a, 0, 1))

        axis = {0: 1, 1: 0}.get(self.axis, self.axis)
        return QuantTensor(self.op, (lead[1], lead[0], *rest), codes, self.code_dtype,
                           t(self.scale), t(self.offset), t(self.lut), axis)

    def rows(self, lo: int, hi: int, pad_to: int = 0) -> QuantTensor:
        """Rows [lo, hi) of a matrix-shaped weight ([O, I, ...]), zero rows appended up
        to `pad_to` (a classifier chunk padded to whole rows of 32): blocks must not
        straddle lo or hi, and a code row must start on a byte."""
        n_rows, cols = self.shape[0], self.size // self.shape[0]
        grid = self._grid_rows()
        block = n_rows // grid if grid else n_rows
        if lo % block or (hi % block and hi != n_rows) or (lo * cols * self.bits) % 8 or (
                (hi * cols * self.bits) % 8 and hi != n_rows):
            raise InvalidArgumentError(f"rows {lo}:{hi} of {list(self.shape)} cut its blocks "
                                       "or its code bytes")
        total = max(pad_to, hi - lo)
        a, b = lo * cols * self.bits // 8, (hi * cols * self.bits + 7) // 8
        pad_codes = ((total * cols * self.bits + 7) // 8) - (b - a)
        codes = np.concatenate([self.codes.reshape(-1)[a:b],
                                np.zeros(pad_codes, self.codes.dtype)])

        def cut(x: np.ndarray | None, zero: float = 0.0) -> np.ndarray | None:
            if x is None or (self.op == "affine" and (x.ndim == 0 or self.axis != 0)):
                return x
            g_lo, g_hi = lo // block, -(-hi // block)
            part = x[g_lo:g_hi]
            extra = -(-total // block) - part.shape[0]
            if extra > 0:
                part = np.concatenate([part, np.full((extra, *part.shape[1:]), zero, x.dtype)])
            return part

        shape = (total, *self.shape[1:])
        post = None
        if self.post_scale is not None:     # padding rows: scale 0
            post = np.concatenate([self.post_scale[lo:hi],
                                   np.zeros(total - (hi - lo), np.float16)])
        if self.op == "affine" and self.axis == 0 and np.asarray(self.offset).ndim:
            # padding rows: scale 0, so whatever the zero point they are 0
            return QuantTensor(self.op, shape, codes, self.code_dtype, cut(self.scale),
                               cut(self.offset), None, self.axis, post)
        return QuantTensor(self.op, shape, codes, self.code_dtype, cut(self.scale),
                           cut(self.offset), cut(self.lut), self.axis, post)

    def _grid_rows(self) -> int:
        """Blocks along the first axis (0: one block spans all rows)."""
        if self.op == "lut":
            return int(self.lut.shape[0])  # type: ignore[union-attr]
        if self.op == "shift_scale":
            return int(self.scale.shape[0])  # type: ignore[union-attr]
        return self.shape[0] if np.asarray(self.scale).ndim and self.axis == 0 else 0
