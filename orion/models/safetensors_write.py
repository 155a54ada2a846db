"""fp32 arrays written as safetensors bytes in float32, float16 or bfloat16.

numpy has no bfloat16, so `safetensors.numpy.save` cannot write it; safetensors' own
serializer takes each tensor's dtype by name with its raw little-endian bytes, so bf16
goes through it as rounded uint16 bits, under the dtype name "bfloat16" (header "BF16").
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

SAVE_DTYPES = ("float32", "float16", "bfloat16")
_STORAGE = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16 (round to nearest, ties to even, as torch's
    .to(torch.bfloat16) does), as their uint16 bit patterns; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16   # uint32 arithmetic
    out = rounded.astype("<u2")
    out[np.isnan(x)] = 0x7FC0
    return out


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` as the little-endian storage array of `dtype` (bf16 as its bits)."""
    if dtype == "bfloat16":
        return bf16_bits(x)
    return np.ascontiguousarray(x, _STORAGE[dtype])


def save(tensors: Mapping[str, np.ndarray], dtype: str,
         metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors file holding every tensor converted to `dtype` (one of SAVE_DTYPES)."""
    import safetensors

    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SAVE_DTYPES)}, got {dtype!r}")
    arrays = {k: encode(v, dtype) for k, v in tensors.items()}   # kept alive while serializing
    spec = getattr(safetensors, "TensorSpec", None)    # safetensors >= 0.8; older: dicts
    flat = {k: (spec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data,
                     data_len=a.nbytes) if spec is not None
                else {"dtype": dtype, "shape": list(a.shape), "data": a.tobytes()})
            for k, a in arrays.items()}
    return bytes(safetensors.serialize(flat, metadata=metadata))
