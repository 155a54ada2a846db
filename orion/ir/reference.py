"""A numpy evaluator of the IR: the reference every compiled program is compared against.

By default it computes in fp32 (float64 for gradient checks). With ``round_fp16=True``
it rounds every op's result to fp16, as vane and the ANE do between ops, which is the
right reference when a test wants tight tolerances.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orion.errors import InvalidArgumentError
from orion.ir.graph import Graph, Node, Value
from orion.ir.ops import Op

GELU_C = float(np.sqrt(2.0 / np.pi))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def eval_node(node: Node, args: list[np.ndarray], dtype: type[np.floating]) -> list[np.ndarray]:
    op, a = node.op, node.attrs
    x = args[0] if args else None
    match op:
        case Op.CONST:
            return [a["value"].astype(dtype)]
        case Op.CONV1X1:
            w = args[1][:, :, 0, 0]
            return [np.einsum("oi,bihs->bohs", w, x)]
        case Op.ADD:
            return [x + args[1]]
        case Op.SUB:
            return [x - args[1]]
        case Op.MUL:
            return [x * args[1]]
        case Op.POW:
            with np.errstate(invalid="ignore", divide="ignore"):
                return [np.power(x, args[1])]
        case Op.MATMUL:
            y = args[1]
            if a["transpose_x"]:
                x = np.swapaxes(x, -1, -2)
            if a["transpose_y"]:
                y = np.swapaxes(y, -1, -2)
            return [np.matmul(x, y)]
        case Op.RESHAPE:
            return [x.reshape(a["shape"])]
        case Op.TRANSPOSE:
            return [np.transpose(x, a["perm"])]
        case Op.CAST:
            return [x]
        case Op.RELU:
            return [np.maximum(x, 0)]
        case Op.TANH:
            return [np.tanh(x)]
        case Op.SIGMOID:
            return [1.0 / (1.0 + np.exp(-x))]
        case Op.EXP:
            return [np.exp(x)]
        case Op.NEG:
            return [-x]
        case Op.SQRT:
            with np.errstate(invalid="ignore"):
                return [np.sqrt(x)]
        case Op.RSQRT:
            with np.errstate(invalid="ignore", divide="ignore"):
                return [1.0 / np.sqrt(x)]
        case Op.IDENTITY:
            return [x]
        case Op.SOFTMAX:
            return [_softmax(x, a["axis"])]
        case Op.REDUCE_SUM:
            return [x.sum(axis=a["axes"], keepdims=a["keep_dims"])]
        case Op.REDUCE_MEAN:
            return [x.mean(axis=a["axes"], keepdims=a["keep_dims"])]
        case Op.REDUCE_MAX:
            return [x.max(axis=a["axes"], keepdims=a["keep_dims"])]
        case Op.CONCAT:
            return [np.concatenate(args, axis=a["axis"])]
        case Op.SPLIT:
            cuts = np.cumsum(a["sizes"])[:-1]
            return list(np.split(x, cuts, axis=a["axis"]))
        case Op.PAD:
            return [np.pad(x, a["pads"])]
        case Op.SLICE:
            return [x[tuple(slice(b, b + s) for b, s in zip(a["begin"], a["size"], strict=True))]]
        case Op.GELU:
            return [gelu_tanh(x)]
        case Op.CLIP:
            return [np.clip(x, a["lo"], a["hi"])]
    raise InvalidArgumentError(f"reference: no rule for op {op.value}")


def evaluate_all(g: Graph, feeds: Mapping[str, np.ndarray], dtype: type[np.floating] = np.float32,
                 round_fp16: bool = False) -> dict[Value, np.ndarray]:
    """Every value of `g` given its inputs by name."""
    env: dict[Value, np.ndarray] = {}
    for node in g.nodes:
        if node.op is Op.INPUT:
            v = node.out
            if v.name not in feeds:
                raise InvalidArgumentError(f"reference: no feed for input {v.name!r}")
            arr = np.asarray(feeds[v.name], dtype=dtype)
            if arr.shape != v.shape:
                raise InvalidArgumentError(f"reference: input {v.name} has shape {arr.shape}, "
                                           f"expected {v.shape}")
            results = [arr]
        else:
            with np.errstate(over="ignore"):
                results = eval_node(node, [env[i] for i in node.inputs], dtype)
        for v, r in zip(node.outputs, results, strict=True):
            r = np.asarray(r, dtype=dtype)
            if round_fp16:
                with np.errstate(over="ignore"):
                    r = r.astype(np.float16).astype(dtype)
            env[v] = r
    return env


def evaluate(g: Graph, feeds: Mapping[str, np.ndarray], dtype: type[np.floating] = np.float32,
             round_fp16: bool = False) -> dict[str, np.ndarray]:
    """The outputs of `g` by name."""
    env = evaluate_all(g, feeds, dtype, round_fp16)
    return {name: env[v] for name, v in g.outputs.items()}
