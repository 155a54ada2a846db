"""fp32 <-> fp16 conversion and fp16 transposes of host arrays on vane's kernels.

numpy's `astype` between float32 and float16 runs at about 1 GB/s on our
machines; these run at memory speed over the kernel threads, with the same
rounding (to nearest even; overflow to inf).
"""

from __future__ import annotations

import numpy as np

from orion.errors import InvalidArgumentError
from orion.runtime._native import check, ffi, lib


def to_fp16(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`array` rounded to float16 (into `out` when given, which must be C-contiguous)."""
    return _convert(array, out, np.float32, np.float16, lib.orion_f32_to_f16)


def to_fp32(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`array` (float16) widened to float32 (into `out` when given)."""
    return _convert(array, out, np.float16, np.float32, lib.orion_f16_to_f32)


_CTYPE = {np.float32: "float *", np.float16: "uint16_t *"}


def _convert(array: np.ndarray, out: np.ndarray | None, src_dtype: type, dst_dtype: type,
             fn: object) -> np.ndarray:
    src = np.ascontiguousarray(array, dtype=src_dtype)
    if out is None:
        out = np.empty(src.shape, dst_dtype)
    _check_out(out, dst_dtype, src.size)
    check(fn(ffi.cast("const " + _CTYPE[src_dtype], ffi.from_buffer(src)),
             ffi.cast(_CTYPE[dst_dtype], ffi.from_buffer(out)), src.size))
    return out


def transpose(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The transpose of a 2-D float16 array, as a C-contiguous copy (into `out` when
    given): a blocked copy over the kernel threads, ~10x numpy's copy of a `.T` view."""
    src = np.ascontiguousarray(array, dtype=np.float16)
    if src.ndim != 2:
        raise InvalidArgumentError(f"transpose takes a 2-D array, not {src.ndim}-D")
    rows, cols = src.shape
    if out is None:
        out = np.empty((cols, rows), np.float16)
    _check_out(out, np.float16, src.size)
    if out.shape != (cols, rows):
        raise InvalidArgumentError(f"out must have shape {(cols, rows)}, not {out.shape}")
    if np.shares_memory(src, out):
        raise InvalidArgumentError("transpose: out overlaps the array")
    check(lib.orion_f16_transpose(ffi.cast("const uint16_t *", ffi.from_buffer(src)), rows, cols,
                                  ffi.cast("uint16_t *", ffi.from_buffer(out))))
    return out


def _check_out(out: np.ndarray, dtype: type, size: int) -> None:
    if out.dtype != dtype or out.size != size or not out.flags.c_contiguous:
        raise InvalidArgumentError(f"out must be a C-contiguous {np.dtype(dtype)} array of {size} "
                                   f"elements")
