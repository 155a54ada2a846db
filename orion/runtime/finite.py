"""The one finite check for host arrays that may be large (a model's weights).

numpy's fp16 `max` and `min` run a scalar loop (~90 ms for a GPT-2 layer's weights), so
fp16 is checked by its exponent bits, an integer pass numpy runs in SIMD, a chunk at a
time; other dtypes by `max` and `min`, which carry NaN and inf through. Neither makes a
temporary as large as the array.
"""

from __future__ import annotations

import numpy as np

FINITE_CHUNK = 1 << 20   # elements of an fp16 array checked at a time


def all_finite(a: np.ndarray) -> bool:
    """Whether no element of `a` is NaN or inf."""
    if a.dtype != np.float16:
        return not a.size or bool(np.isfinite(a.max()) and np.isfinite(a.min()))
    bits = np.ascontiguousarray(a).reshape(-1).view(np.uint16)
    for start in range(0, bits.size, FINITE_CHUNK):
        if (bits[start:start + FINITE_CHUNK] & 0x7C00).max() == 0x7C00:
            return False
    return True
