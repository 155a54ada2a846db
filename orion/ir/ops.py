"""The op set and its shape inference.

The IR has exactly the 27 ops of the Orion paper (ane-facts §2.4b). Two more ops exist
outside that set, each confined to one side of legalization:

- ``gelu`` is a front-end convenience (``Graph.gelu``). The pass ``rewrite_gelu_tanh``
  replaces it by its tanh approximation before anything is emitted (ANE-C02).
- ``clip`` is introduced only by the pass ``insert_fp16_clamps`` (ANE-C41) and is emitted
  as MIL ``clip(x, alpha, beta)``. A clamp cannot be built from the 27 ops without
  overflowing on exactly the values it must catch (``relu(x + 65504)`` is inf at x = 65504).

``rsqrt`` and ``concat`` are in the set but not accepted by the device (ANE-C03, ANE-C01);
passes rewrite rsqrt as ``pow(x, -0.5)`` and cut the graph at concat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np

from orion.ir.types import DType, ShapeError, TensorType


class Op(str, Enum):
    INPUT = "input"
    CONST = "const"
    CONV1X1 = "conv1x1"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    MATMUL = "matmul"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    CAST = "cast"
    RELU = "relu"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    SOFTMAX = "softmax"
    EXP = "exp"
    POW = "pow"
    REDUCE_SUM = "reduce_sum"
    REDUCE_MEAN = "reduce_mean"
    REDUCE_MAX = "reduce_max"
    NEG = "neg"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    CONCAT = "concat"
    SPLIT = "split"
    PAD = "pad"
    SLICE = "slice"
    IDENTITY = "identity"
    # outside the 27, see the module docstring
    GELU = "gelu"
    CLIP = "clip"


IR_OPS: frozenset[Op] = frozenset(op for op in Op if op not in (Op.GELU, Op.CLIP))
UNARY_OPS: frozenset[Op] = frozenset(
    {Op.RELU, Op.TANH, Op.SIGMOID, Op.EXP, Op.NEG, Op.SQRT, Op.RSQRT, Op.IDENTITY,
     Op.GELU, Op.CLIP}
)
BINARY_OPS: frozenset[Op] = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.POW})
REDUCE_OPS: frozenset[Op] = frozenset({Op.REDUCE_SUM, Op.REDUCE_MEAN, Op.REDUCE_MAX})

assert len(IR_OPS) == 27


def broadcast_shapes(op: Op, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy broadcasting, restricted to equal ranks or a rank-0 operand (as MIL allows)."""
    if not a:
        return b
    if not b:
        return a
    if len(a) != len(b):
        raise ShapeError(f"{op.value}: operands of rank {len(a)} {list(a)} and {len(b)} "
                         f"{list(b)} must have the same rank (or one must be a scalar)")
    out = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y and 1 not in (x, y):
            raise ShapeError(f"{op.value}: shapes {list(a)} and {list(b)} do not broadcast "
                             f"(axis {i}: {x} vs {y})")
        out.append(max(x, y))
    return tuple(out)


def normalize_axis(op: Op, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{op.value}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def _same_dtype(op: Op, types: Sequence[TensorType]) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"{op.value}: operand dtypes differ: {[str(t) for t in types]}")
    return types[0].dtype


def _arity(op: Op, types: Sequence[TensorType], n: int) -> None:
    if len(types) != n:
        raise ShapeError(f"{op.value}: takes {n} operand(s), got {len(types)}")


def infer(op: Op, types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    """Result types of `op` applied to operands of `types`. Raises ShapeError."""
    if op is Op.INPUT:
        return [attrs["type"]]
    if op is Op.CONST:
        value: np.ndarray = attrs["value"]
        return [TensorType(tuple(value.shape), attrs.get("dtype", DType.FP16))]
    if op in UNARY_OPS:
        _arity(op, types, 1)
        return [types[0]]
    if op in BINARY_OPS:
        _arity(op, types, 2)
        dtype = _same_dtype(op, types)
        return [TensorType(broadcast_shapes(op, types[0].shape, types[1].shape), dtype)]
    rule = _RULES.get(op)
    if rule is None:
        raise ShapeError(f"no shape rule for op {op.value}")
    return rule(types, attrs)


def _conv1x1(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    op = Op.CONV1X1
    _arity(op, types, 2)
    x, w = types
    dtype = _same_dtype(op, types)
    if x.rank != 4 or x.shape[0] != 1 or x.shape[2] != 1:
        raise ShapeError(f"conv1x1: x must be [1, C, 1, S] (channel-first), got {list(x.shape)}")
    if w.rank != 4 or w.shape[2:] != (1, 1):
        raise ShapeError(f"conv1x1: weight must be [O, I, 1, 1], got {list(w.shape)}")
    if w.shape[1] != x.shape[1]:
        raise ShapeError(f"conv1x1: weight has {w.shape[1]} input channels but x has "
                         f"{x.shape[1]} ({list(w.shape)} vs {list(x.shape)})")
    return [TensorType((1, w.shape[0], 1, x.shape[3]), dtype)]


def _matmul(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    op = Op.MATMUL
    _arity(op, types, 2)
    dtype = _same_dtype(op, types)
    x, y = types
    if x.rank < 2 or x.rank != y.rank:
        raise ShapeError(f"matmul: operands must have the same rank >= 2, got "
                         f"{list(x.shape)} and {list(y.shape)}")
    m, kx = x.shape[-2:][::-1] if attrs["transpose_x"] else x.shape[-2:]
    ky, n = y.shape[-2:][::-1] if attrs["transpose_y"] else y.shape[-2:]
    if kx != ky:
        raise ShapeError(
            f"matmul: inner dimensions differ: x {list(x.shape)} (transpose_x="
            f"{attrs['transpose_x']}) gives K={kx}, y {list(y.shape)} (transpose_y="
            f"{attrs['transpose_y']}) gives K={ky}")
    batch = broadcast_shapes(op, x.shape[:-2], y.shape[:-2])
    return [TensorType((*batch, m, n), dtype)]


def _reshape(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _arity(Op.RESHAPE, types, 1)
    shape = tuple(attrs["shape"])
    if any(d <= 0 for d in shape) or np.prod(shape) != types[0].numel:
        raise ShapeError(f"reshape: cannot reshape {list(types[0].shape)} "
                         f"({types[0].numel} elements) to {list(shape)}")
    return [TensorType(shape, types[0].dtype)]


def _transpose(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _arity(Op.TRANSPOSE, types, 1)
    perm = tuple(attrs["perm"])
    x = types[0]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"transpose: perm {list(perm)} is not a permutation of the "
                         f"{x.rank} axes of {list(x.shape)}")
    return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]


def _cast(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _arity(Op.CAST, types, 1)
    return [TensorType(types[0].shape, attrs["dtype"])]


def _softmax(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _arity(Op.SOFTMAX, types, 1)
    normalize_axis(Op.SOFTMAX, attrs["axis"], types[0].rank)
    return [types[0]]


def _reduce(op: Op):  # noqa: ANN202 - a rule factory
    def rule(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
        _arity(op, types, 1)
        x = types[0]
        axes = {normalize_axis(op, a, x.rank) for a in attrs["axes"]}
        if attrs["keep_dims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return [TensorType(shape, x.dtype)]
    return rule


def _concat(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    if len(types) < 2:
        raise ShapeError(f"concat: needs at least 2 operands, got {len(types)}")
    dtype = _same_dtype(Op.CONCAT, types)
    rank = types[0].rank
    axis = normalize_axis(Op.CONCAT, attrs["axis"], rank)
    for t in types[1:]:
        if t.rank != rank or any(a != b for i, (a, b) in enumerate(
                zip(t.shape, types[0].shape, strict=True)) if i != axis):
            raise ShapeError(f"concat: operands {[list(t.shape) for t in types]} differ "
                             f"outside axis {axis}")
    shape = list(types[0].shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return [TensorType(tuple(shape), dtype)]


def _split(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _arity(Op.SPLIT, types, 1)
    x = types[0]
    axis = normalize_axis(Op.SPLIT, attrs["axis"], x.rank)
    sizes = tuple(attrs["sizes"])
    if any(s <= 0 for s in sizes) or sum(sizes) != x.shape[axis]:
        raise ShapeError(f"split: sizes {list(sizes)} do not sum to axis {axis} of "
                         f"{list(x.shape)}")
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        out.append(TensorType(tuple(shape), x.dtype))
    return out


def _pad(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _arity(Op.PAD, types, 1)
    x = types[0]
    pads = tuple(attrs["pads"])
    if len(pads) != x.rank or any(len(p) != 2 or min(p) < 0 for p in pads):
        raise ShapeError(f"pad: pads {list(pads)} must be one non-negative (before, after) "
                         f"pair per axis of {list(x.shape)}")
    return [TensorType(tuple(d + b + a for d, (b, a) in zip(x.shape, pads, strict=True)),
                       x.dtype)]


def _slice(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    _arity(Op.SLICE, types, 1)
    x = types[0]
    begin, size = tuple(attrs["begin"]), tuple(attrs["size"])
    if len(begin) != x.rank or len(size) != x.rank or any(
            b < 0 or s <= 0 or b + s > d for b, s, d in zip(begin, size, x.shape, strict=True)):
        raise ShapeError(f"slice: begin {list(begin)} size {list(size)} is not inside "
                         f"{list(x.shape)}")
    return [TensorType(size, x.dtype)]


_RULES = {
    Op.CONV1X1: _conv1x1,
    Op.MATMUL: _matmul,
    Op.RESHAPE: _reshape,
    Op.TRANSPOSE: _transpose,
    Op.CAST: _cast,
    Op.SOFTMAX: _softmax,
    Op.REDUCE_SUM: _reduce(Op.REDUCE_SUM),
    Op.REDUCE_MEAN: _reduce(Op.REDUCE_MEAN),
    Op.REDUCE_MAX: _reduce(Op.REDUCE_MAX),
    Op.CONCAT: _concat,
    Op.SPLIT: _split,
    Op.PAD: _pad,
    Op.SLICE: _slice,
}
