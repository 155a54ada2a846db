"""Value types of the IR: a dtype and a static shape, and the error shape inference raises."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod

import numpy as np

from orion.errors import OrionError


class DType(str, Enum):
    """Element types. The device computes in fp16 (ANE-C40); fp32 exists only for casts."""

    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def itemsize(self) -> int:
        return 2 if self is DType.FP16 else 4

    @property
    def numpy(self) -> type[np.floating]:
        return np.float16 if self is DType.FP16 else np.float32


@dataclass(frozen=True)
class TensorType:
    """A tensor of static shape; rank 0 is a scalar."""

    shape: tuple[int, ...]
    dtype: DType = DType.FP16

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"


class ShapeError(OrionError, ValueError):
    """An op was given operands whose types it cannot combine. The message names the op
    (and the node, once it has one) and says which operand is wrong and why."""
