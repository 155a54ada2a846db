"""Reverse-mode differentiation of a graph: the backward program of any block.

    bwd = backward(fwd, wrt=["x"], seeds=["y"], taps={"dq": Grad(q), "xn": Forward(xn)})
    # bwd.graph: the inputs of `fwd` (same names, same order), then grad_y; outputs
    #            grad_x and the taps

The backward graph recomputes the forward values it needs from the forward inputs
(the block's activations are never stored between the programs, only its input), then
sweeps the nodes in reverse, each op's vector-Jacobian product built from the same 27
ops. Weights are not differentiated: a baked weight is a const, and training computes
weight gradients on the host from taps (a linear layer's input and the gradient at its
output, `Forward` and `Grad`). `conv1x1`'s input gradient bakes W^T; `transposed`
names those consts and the weight each comes from, so a delta update can patch them.

A composite may carry its own backward (`Graph.custom_vjp`): the norms do, because the
generic product through their max-scaling would form inv^3, which overflows fp16
(`orion.ir.composites.normalize`). Ops with no derivative the IR can express without a
comparison (relu, reduce_max, clip) are refused by name when a gradient reaches them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from orion.errors import OrionError
from orion.ir import grads as G
from orion.ir.graph import Graph, Value, copy_node, prune
from orion.ir.ops import Op
from orion.ir.quant import QuantTensor


class AutodiffError(OrionError, ValueError):
    """A graph cannot be differentiated as asked; the message names the node."""


@dataclass(frozen=True)
class Forward:
    """A tap of a forward value (recomputed in the backward program)."""

    value: Value


@dataclass(frozen=True)
class Grad:
    """A tap of the gradient at a forward value."""

    value: Value


Tap = Forward | Grad


@dataclass
class Backward:
    graph: Graph
    # backward const name -> the forward const it transposes (conv1x1's W^T)
    transposed: dict[str, str] = field(default_factory=dict)


def grad_name(name: str) -> str:
    return f"grad_{name}"


def backward(fwd: Graph, *, wrt: Sequence[str], seeds: Sequence[str],
             taps: Mapping[str, Tap] | None = None, name: str | None = None) -> Backward:
    """The backward graph of `fwd`: gradients of the inputs named in `wrt`, given the
    gradients of the outputs named in `seeds` (its inputs `grad_<output>`), and `taps`
    as further outputs. Inputs not in `wrt` (weights, adapters, masks) get none."""
    sweep = _Sweep(fwd, Graph(name or f"{fwd.name}_bwd"))
    sweep.copy_forward()
    for out in seeds:
        if out not in fwd.outputs:
            raise AutodiffError(f"{fwd.name} has no output {out!r} to differentiate")
        v = fwd.outputs[out]
        sweep.accumulate(v, sweep.g.input(grad_name(out), v.shape, v.dtype))
    wrt_values = [fwd.input_named(n) for n in wrt]
    sweep.run(set(wrt_values))
    g = sweep.g
    for v in wrt_values:
        g.output(grad_name(v.name), sweep.adjoint_or_zero(v))
    for tap_name, tap in (taps or {}).items():
        if isinstance(tap, Forward):
            g.output(tap_name, sweep.vmap[tap.value])
        else:
            g.output(tap_name, sweep.adjoint_or_zero(tap.value))
    return Backward(prune(g), sweep.transposed)


class _Sweep:
    def __init__(self, fwd: Graph, g: Graph) -> None:
        self.fwd, self.g = fwd, g
        self.vmap: dict[Value, Value] = {}
        self.adj: dict[Value, Value] = {}
        self.transposed: dict[str, str] = {}
        self._ones: dict[tuple[int, ...], Value] = {}

    def copy_forward(self) -> None:
        for node in self.fwd.nodes:
            if node.op is Op.INPUT:
                v = node.out
                self.vmap[v] = self.g.input(v.name, v.shape, v.dtype)
                continue
            outs = copy_node(self.g, node, [self.vmap[v] for v in node.inputs])
            self.vmap.update(zip(node.outputs, outs, strict=True))

    def accumulate(self, v: Value, d: Value) -> None:
        if d.shape != v.shape:
            raise AutodiffError(f"gradient of {v.name} has shape {list(d.shape)}, the value "
                                f"{list(v.shape)}")
        old = self.adj.get(v)
        self.adj[v] = d if old is None else self.g.add(old, d, name=f"d_{v.name}_acc")

    def adjoint_or_zero(self, v: Value) -> Value:
        d = self.adj.get(v)
        return d if d is not None else self.g.mul(self.vmap[v], 0.0, name=f"d_{v.name}_zero")

    def run(self, wrt: set[Value]) -> None:
        needs = _needs_grad(self.fwd, wrt)
        custom = self.fwd.custom_vjps
        for node in reversed(self.fwd.nodes):
            douts = [self.adj.get(v) for v in node.outputs]
            if all(d is None for d in douts) or node.op in (Op.INPUT, Op.CONST):
                continue
            rule = custom.get(node.outputs[0]) if len(node.outputs) == 1 else None
            if rule is not None:
                inputs, fn = rule
                dins = fn(self.g, [self.vmap[v] for v in inputs], douts[0])
                for v, d in zip(inputs, dins, strict=True):
                    if d is not None and v in needs:
                        self.accumulate(v, d)
                continue
            with self.g.scope(f"d_{node.name}"):
                dins = _vjp(self, node, douts, [v in needs for v in node.inputs])
            for v, d in zip(node.inputs, dins, strict=True):
                if d is not None and v in needs:
                    self.accumulate(v, d)

    # ---- helpers the rules use ---------------------------------------------------

    def ones(self, shape: tuple[int, ...]) -> Value:
        if shape not in self._ones:
            self._ones[shape] = self.g.const(np.ones(shape, np.float32), name="ones")
        return self._ones[shape]

    def broadcast_to(self, d: Value, shape: tuple[int, ...]) -> Value:
        """`d` (1 on some axes of `shape`) repeated along them."""
        if d.shape == shape:
            return d
        ones = tuple(s if a == 1 and s != 1 else 1 for a, s in zip(d.shape, shape, strict=True))
        return self.g.mul(d, self.ones(ones), name="bcast")

    def unbroadcast(self, d: Value, shape: tuple[int, ...]) -> Value:
        """`d` summed over the axes that broadcasting widened to give `shape` back."""
        if d.shape == shape:
            return d
        axes = [i for i, (a, s) in enumerate(zip(d.shape, shape, strict=True))
                if s == 1 and a != 1]
        return self.g.reduce_sum(d, axes, keep_dims=True, name="unbcast")


def _needs_grad(g: Graph, wrt: set[Value]) -> set[Value]:
    """The values that depend on a `wrt` input (only they carry gradients)."""
    out = set(wrt)
    for node in g.nodes:
        if any(v in out for v in node.inputs):
            out.update(node.outputs)
    return out


def _scalar(node_input: Value) -> float | None:
    n = node_input.node
    if n.op is Op.CONST and np.asarray(n.attrs["value"]).ndim == 0:
        return float(n.attrs["value"])
    return None


def _vjp(s: _Sweep, node: object, douts: list[Value | None], need: list[bool]
         ) -> list[Value | None]:
    """Gradients of `node`'s inputs from its outputs' (`douts`), where `need` says."""
    from orion.ir.graph import Node

    assert isinstance(node, Node)
    g, op, a = s.g, node.op, node.attrs
    xs = [s.vmap[v] for v in node.inputs]
    ys = [s.vmap[v] for v in node.outputs]
    dy = douts[0]
    if op is Op.SPLIT:
        return [_split_vjp(s, node, douts)]
    assert dy is not None
    x = xs[0]
    y = ys[0]
    match op:
        case Op.IDENTITY:
            return [dy]
        case Op.NEG:
            return [g.neg(dy)]
        case Op.CAST:
            return [g.cast(dy, node.inputs[0].dtype)]
        case Op.ADD | Op.SUB:
            second = g.neg(dy) if op is Op.SUB and need[1] else dy
            return [s.unbroadcast(dy, x.shape) if need[0] else None,
                    s.unbroadcast(second, xs[1].shape) if need[1] else None]
        case Op.MUL:
            return [s.unbroadcast(g.mul(dy, xs[1]), x.shape) if need[0] else None,
                    s.unbroadcast(g.mul(dy, x), xs[1].shape) if need[1] else None]
        case Op.POW:
            p = _scalar(node.inputs[1])
            if p is None or need[1]:
                raise AutodiffError(f"{node.name}: pow is differentiated only for a "
                                    "constant scalar exponent")
            d = g.mul(dy, p) if p == 1.0 else g.mul(g.mul(dy, g.pow(x, p - 1.0)), p)
            return [s.unbroadcast(d, x.shape), None]
        case Op.EXP:
            return [g.mul(dy, y)]
        case Op.TANH:
            return [g.sub(dy, g.mul(g.mul(dy, y), y))]
        case Op.SIGMOID:
            return [g.mul(g.mul(dy, y), g.sub(1.0, y))]
        case Op.SQRT:
            return [g.mul(g.mul(dy, g.pow(y, -1.0)), 0.5)]
        case Op.RSQRT:
            return [g.mul(g.mul(g.mul(dy, y), g.mul(y, y)), -0.5)]
        case Op.GELU:
            return [G.gelu_tanh_backward(g, x, dy)]
        case Op.SOFTMAX:
            dot = g.reduce_sum(g.mul(dy, y), a["axis"], keep_dims=True)
            return [g.mul(y, g.sub(dy, dot))]
        case Op.REDUCE_SUM | Op.REDUCE_MEAN:
            keep = tuple(1 if i in a["axes"] else d for i, d in enumerate(x.shape))
            d = dy if dy.shape == keep else g.reshape(dy, keep)
            if op is Op.REDUCE_MEAN:
                d = g.mul(d, 1.0 / float(np.prod([x.shape[i] for i in a["axes"]])))
            return [s.broadcast_to(d, x.shape)]
        case Op.RESHAPE:
            return [g.reshape(dy, x.shape)]
        case Op.TRANSPOSE:
            return [g.transpose(dy, tuple(int(i) for i in np.argsort(a["perm"])))]
        case Op.PAD:
            return [g.slice(dy, [b for b, _ in a["pads"]], x.shape)]
        case Op.SLICE:
            pads = [(b, d - b - n) for b, n, d in zip(a["begin"], a["size"], x.shape,
                                                      strict=True)]
            return [g.pad(dy, pads)]
        case Op.CONV1X1:
            w = node.inputs[1].node
            if isinstance(w.attrs["value"], QuantTensor):   # frozen, compressed: W^T exactly
                const = g.const(w.attrs["value"].transposed(), name=f"{w.name}_T")
                return [g.conv1x1(dy, const), None]
            wt = np.ascontiguousarray(np.transpose(w.attrs["value"], (1, 0, 2, 3)))
            wt.setflags(write=False)
            const = g.const(wt, name=f"{w.name}_T")
            s.transposed[const.name] = w.name
            return [g.conv1x1(dy, const), None]
        case Op.MATMUL:
            return _matmul_vjp(s, node, dy, need)
    raise AutodiffError(f"{node.name}: no gradient for {op.value} (the IR has no comparison "
                        "to express its derivative); keep it out of differentiated paths")


def _matmul_vjp(s: _Sweep, node: object, dy: Value, need: list[bool]) -> list[Value | None]:
    """out = A B with A = x or x^T, B = y or y^T: dA = dy B^T, dB = A^T dy."""
    from orion.ir.graph import Node

    assert isinstance(node, Node)
    g = s.g
    x, y = (s.vmap[v] for v in node.inputs)
    tx, ty = node.attrs["transpose_x"], node.attrs["transpose_y"]
    dx = dw = None
    if need[0]:
        dx = (g.matmul(y, dy, transpose_x=ty, transpose_y=True) if tx
              else g.matmul(dy, y, transpose_y=not ty))
        dx = s.unbroadcast(dx, x.shape)
    if need[1]:
        dw = (g.matmul(dy, x, transpose_x=True, transpose_y=tx) if ty
              else g.matmul(x, dy, transpose_x=not tx))
        dw = s.unbroadcast(dw, y.shape)
    return [dx, dw]


def _split_vjp(s: _Sweep, node: object, douts: list[Value | None]) -> Value:
    """The parts' gradients put back in place (pad + add: no concat, ANE-C01)."""
    from orion.ir.graph import Node

    assert isinstance(node, Node)
    g, axis = s.g, node.attrs["axis"]
    x = s.vmap[node.inputs[0]]
    total, at = None, 0
    for d, size in zip(douts, node.attrs["sizes"], strict=True):
        if d is not None:
            pads = [(0, 0)] * len(x.shape)
            pads[axis] = (at, x.shape[axis] - at - size)
            part = g.pad(d, pads)
            total = part if total is None else g.add(total, part)
        at += size
    assert total is not None
    return total
