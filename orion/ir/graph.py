"""The graph IR: values, nodes, and a graph that is also its own builder.

A graph is a list of nodes in topological order (every node is appended after its
operands exist, and passes rebuild graphs in order, so the list order is always a valid
schedule). Each node produces one value, or several for ``split``. Shape inference runs
as each node is added, so a wrong shape fails at the line of model code that made it.

    g = Graph("mlp")
    x = g.input("x", (1, 768, 1, 256))
    h = g.gelu(g.conv1x1(x, g.const(w_fc, name="w_fc")) + g.const(b_fc, name="b_fc"))
    g.output("y", h)
    print(dump_graph(g))          # orion.ir.dump
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError
from orion.ir.ops import Op, infer, normalize_axis
from orion.ir.quant import QuantTensor
from orion.ir.types import DType, ShapeError, TensorType
from orion.runtime.finite import all_finite

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")



@dataclass(eq=False)
class Value:
    """One result of a node: a typed SSA value."""

    name: str
    type: TensorType
    node: Node
    index: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def graph(self) -> Graph:
        return self.node.graph

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"

    # arithmetic that reads like the math; every operator is a builder call
    def __add__(self, other: Value | float) -> Value:
        return self.graph.add(self, other)

    def __radd__(self, other: float) -> Value:
        return self.graph.add(other, self)

    def __sub__(self, other: Value | float) -> Value:
        return self.graph.sub(self, other)

    def __rsub__(self, other: float) -> Value:
        return self.graph.sub(other, self)

    def __mul__(self, other: Value | float) -> Value:
        return self.graph.mul(self, other)

    def __rmul__(self, other: float) -> Value:
        return self.graph.mul(other, self)

    def __neg__(self) -> Value:
        return self.graph.neg(self)

    def __matmul__(self, other: Value) -> Value:
        return self.graph.matmul(self, other)


@dataclass(eq=False)
class Node:
    """One op application. `group` is (composite kind, instance number) for nodes that a
    composite helper built, e.g. ("layer_norm", 3); passes use it to find composites."""

    op: Op
    name: str
    inputs: tuple[Value, ...]
    attrs: dict[str, Any]
    graph: Graph
    group: tuple[str, int] | None = None
    outputs: list[Value] = field(default_factory=list)

    @property
    def out(self) -> Value:
        if len(self.outputs) != 1:
            raise InvalidArgumentError(f"node {self.name} ({self.op.value}) has "
                                       f"{len(self.outputs)} results")
        return self.outputs[0]


class Graph:
    """A computation: inputs, nodes in topological order, named outputs."""

    def __init__(self, name: str = "graph") -> None:
        if not _IDENT.match(name):
            raise InvalidArgumentError(f"graph name {name!r} is not an identifier")
        self.name = name
        self.nodes: list[Node] = []
        self.outputs: dict[str, Value] = {}
        self._names: set[str] = set()
        self._scope: list[str] = []
        self._group: tuple[str, int] | None = None
        self._group_counts: dict[str, int] = {}
        # value -> (its operands, the rule that builds their gradients): a composite's
        # own backward, used by orion.ir.autodiff in place of its ops' products
        self.custom_vjps: dict[Value, tuple[tuple[Value, ...], VJPRule]] = {}

    # ---- structure ---------------------------------------------------------

    @property
    def inputs(self) -> list[Value]:
        return [n.out for n in self.nodes if n.op is Op.INPUT]

    def custom_vjp(self, value: Value, operands: Sequence[Value], rule: VJPRule) -> None:
        """Declares how to differentiate `value` as a whole: `rule(g, operands, d_value)`
        builds, in a backward graph g, one gradient per operand (None: no gradient)."""
        self._own(value)
        self.custom_vjps[value] = (tuple(operands), rule)

    def input_named(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise InvalidArgumentError(f"graph {self.name} has no input {name!r}")

    def users(self) -> dict[Value, list[Node]]:
        """For each value, the nodes that read it (in order)."""
        out: dict[Value, list[Node]] = {v: [] for n in self.nodes for v in n.outputs}
        for n in self.nodes:
            for v in n.inputs:
                out[v].append(n)
        return out

    def output(self, name: str, value: Value) -> Value:
        if not _IDENT.match(name):
            raise InvalidArgumentError(f"output name {name!r} is not an identifier")
        if name in self.outputs:
            raise InvalidArgumentError(f"graph {self.name} already has an output {name!r}")
        self._own(value)
        self.outputs[name] = value
        return value

    def _own(self, value: Value) -> None:
        if value.node.graph is not self:
            raise InvalidArgumentError(f"value {value.name} belongs to graph "
                                       f"{value.node.graph.name}, not {self.name}")

    def _unique(self, base: str) -> str:
        if not _IDENT.match(base):
            raise InvalidArgumentError(f"name {base!r} is not an identifier")
        name, n = base, 1
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        return name

    @contextmanager
    def scope(self, prefix: str) -> Iterator[None]:
        """Names of nodes made inside start with `prefix` (nested scopes join with _)."""
        self._scope.append(prefix)
        try:
            yield
        finally:
            self._scope.pop()

    @contextmanager
    def composite(self, kind: str, prefix: str | None = None) -> Iterator[None]:
        """Marks the nodes made inside as one instance of a composite (e.g. layer_norm)."""
        if self._group is not None:  # nested composites belong to the outer one
            with self.scope(prefix or kind):
                yield
            return
        n = self._group_counts.get(kind, 0)
        self._group_counts[kind] = n + 1
        self._group = (kind, n)
        try:
            with self.scope(prefix or kind):
                yield
        finally:
            self._group = None

    def add_node(self, op: Op, inputs: Sequence[Value], attrs: Mapping[str, Any] | None = None,
                 name: str | None = None, group: tuple[str, int] | None = None,
                 exact_name: bool = False) -> Node:
        """Appends a node after inferring its result types. The low-level entry point;
        the builder methods below are what model code calls."""
        attrs = dict(attrs or {})
        for v in inputs:
            self._own(v)
        base = name or op.value
        if not exact_name and self._scope:
            base = "_".join([*self._scope, base])
        try:
            types = infer(op, [v.type for v in inputs], attrs)
        except ShapeError as e:
            operands = ", ".join(repr(v) for v in inputs)
            raise ShapeError(f"{e} [building {base!r} from {operands}]") from None
        node = Node(op, self._unique(base), tuple(inputs), attrs, self,
                    group if group is not None else self._group)
        if len(types) == 1:
            node.outputs = [Value(node.name, types[0], node, 0)]
        else:
            node.outputs = [Value(self._unique(f"{node.name}_{i}"), t, node, i)
                            for i, t in enumerate(types)]
        self.nodes.append(node)
        return node

    def _op(self, op: Op, *inputs: Value, name: str | None = None, **attrs: Any) -> Value:
        return self.add_node(op, inputs, attrs, name).out

    def _operand(self, x: Value | float, like: Value | None) -> Value:
        if isinstance(x, Value):
            return x
        dtype = like.dtype if like is not None else DType.FP16
        return self.const(np.float32(x), dtype=dtype, name="c")

    # ---- sources -------------------------------------------------------------

    def input(self, name: str, shape: Sequence[int], dtype: DType | str = DType.FP16) -> Value:
        if name in self._names:
            raise InvalidArgumentError(f"graph {self.name} already has a value named {name!r}")
        t = TensorType(tuple(int(d) for d in shape), DType(dtype))
        if t.rank == 0 or any(d <= 0 for d in t.shape):
            raise ShapeError(f"input {name}: shape {list(shape)} must have rank >= 1 and "
                             f"positive dimensions")
        return self.add_node(Op.INPUT, (), {"type": t}, name, exact_name=True).out

    def const(self, value: np.ndarray | QuantTensor | float, name: str | None = None,
              dtype: DType | str = DType.FP16) -> Value:
        """A constant. Tensors (rank >= 1) become weight-blob entries; scalars are emitted
        as inline fp16 consts; a QuantTensor (a compressed fp16 weight) becomes its
        compressed parts and the constexpr op that expands them (orion.ir.quant)."""
        if isinstance(value, QuantTensor):
            if value.post_scale is not None:   # a const is the op's value alone
                raise InvalidArgumentError(f"const {name}: a compressed weight with a "
                                           "post_scale; bake unscaled() and multiply the "
                                           "product by the scale")
            return self._op(Op.CONST, name=name or "const", value=value, dtype=DType.FP16)
        src = np.asarray(value)
        # fp16 stays fp16: a model's classifier is hundreds of MiB, twice that in fp32
        want = np.float16 if src.dtype == np.float16 else np.float32
        # a frozen array (read-only, over memory no writable array owns) is kept as it
        # is: nothing can change it, and a copy would hold a model's layer twice
        arr = src if src.dtype == want and _frozen(src) else np.array(src, dtype=want)
        if not all_finite(arr):   # at every compile, over every weight
            raise InvalidArgumentError(f"const {name}: non-finite values")
        arr.setflags(write=False)
        return self._op(Op.CONST, name=name or "const", value=arr, dtype=DType(dtype))

    # ---- linear algebra ----------------------------------------------------

    def conv1x1(self, x: Value, weight: Value, name: str | None = None) -> Value:
        """y[o, s] = sum_i W[o, i] x[i, s] for x [1, I, 1, S], W [O, I, 1, 1] (a const)."""
        if weight.node.op is not Op.CONST:
            raise ShapeError(f"conv1x1: the weight must be a const (it is baked into the "
                             f"program), got {weight!r} from {weight.node.op.value}")
        return self._op(Op.CONV1X1, x, weight, name=name)

    def matmul(self, x: Value, y: Value, transpose_x: bool = False, transpose_y: bool = False,
               name: str | None = None) -> Value:
        return self._op(Op.MATMUL, x, y, name=name, transpose_x=bool(transpose_x),
                        transpose_y=bool(transpose_y))

    # ---- elementwise -------------------------------------------------------

    def _binary(self, op: Op, x: Value | float, y: Value | float, name: str | None) -> Value:
        like = x if isinstance(x, Value) else y if isinstance(y, Value) else None
        if like is None:
            raise ShapeError(f"{op.value}: at least one operand must be a value")
        return self._op(op, self._operand(x, like), self._operand(y, like), name=name)

    def add(self, x: Value | float, y: Value | float, name: str | None = None) -> Value:
        return self._binary(Op.ADD, x, y, name)

    def sub(self, x: Value | float, y: Value | float, name: str | None = None) -> Value:
        return self._binary(Op.SUB, x, y, name)

    def mul(self, x: Value | float, y: Value | float, name: str | None = None) -> Value:
        return self._binary(Op.MUL, x, y, name)

    def pow(self, x: Value, y: Value | float, name: str | None = None) -> Value:
        return self._binary(Op.POW, x, y, name)

    def relu(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.RELU, x, name=name)

    def tanh(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.TANH, x, name=name)

    def sigmoid(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.SIGMOID, x, name=name)

    def exp(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.EXP, x, name=name)

    def neg(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.NEG, x, name=name)

    def sqrt(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.SQRT, x, name=name)

    def rsqrt(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.RSQRT, x, name=name)

    def identity(self, x: Value, name: str | None = None) -> Value:
        return self._op(Op.IDENTITY, x, name=name)

    def gelu(self, x: Value, name: str | None = None) -> Value:
        """GELU (tanh form). Not an IR op: `rewrite_gelu_tanh` expands it (ANE-C02)."""
        return self._op(Op.GELU, x, name=name)

    def clip(self, x: Value, lo: float, hi: float, name: str | None = None) -> Value:
        """Clamp to [lo, hi]. Not an IR op: legalization inserts it (ANE-C41)."""
        return self._op(Op.CLIP, x, name=name, lo=float(lo), hi=float(hi))

    def cast(self, x: Value, dtype: DType | str, name: str | None = None) -> Value:
        return self._op(Op.CAST, x, name=name, dtype=DType(dtype))

    # ---- reductions --------------------------------------------------------

    def softmax(self, x: Value, axis: int = -1, name: str | None = None) -> Value:
        axis = normalize_axis(Op.SOFTMAX, axis, len(x.shape))
        return self._op(Op.SOFTMAX, x, name=name, axis=axis)

    def _reduce(self, op: Op, x: Value, axes: int | Sequence[int], keep_dims: bool,
                name: str | None) -> Value:
        axes_t = (axes,) if isinstance(axes, int) else tuple(axes)
        norm = tuple(sorted({normalize_axis(op, a, len(x.shape)) for a in axes_t}))
        return self._op(op, x, name=name, axes=norm, keep_dims=bool(keep_dims))

    def reduce_sum(self, x: Value, axes: int | Sequence[int], keep_dims: bool = True,
                   name: str | None = None) -> Value:
        return self._reduce(Op.REDUCE_SUM, x, axes, keep_dims, name)

    def reduce_mean(self, x: Value, axes: int | Sequence[int], keep_dims: bool = True,
                    name: str | None = None) -> Value:
        return self._reduce(Op.REDUCE_MEAN, x, axes, keep_dims, name)

    def reduce_max(self, x: Value, axes: int | Sequence[int], keep_dims: bool = True,
                   name: str | None = None) -> Value:
        return self._reduce(Op.REDUCE_MAX, x, axes, keep_dims, name)

    # ---- data movement -----------------------------------------------------

    def reshape(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value:
        shape_l = [int(d) for d in shape]
        if shape_l.count(-1) == 1:
            known = int(np.prod([d for d in shape_l if d != -1]))
            if known > 0 and x.type.numel % known == 0:
                shape_l[shape_l.index(-1)] = x.type.numel // known
        return self._op(Op.RESHAPE, x, name=name, shape=tuple(shape_l))

    def transpose(self, x: Value, perm: Sequence[int], name: str | None = None) -> Value:
        return self._op(Op.TRANSPOSE, x, name=name, perm=tuple(int(p) for p in perm))

    def concat(self, values: Sequence[Value], axis: int, name: str | None = None) -> Value:
        rank = len(values[0].shape) if values else 0
        return self.add_node(Op.CONCAT, tuple(values),
                             {"axis": normalize_axis(Op.CONCAT, axis, max(rank, 1))}, name).out

    def split(self, x: Value, sizes: Sequence[int], axis: int,
              name: str | None = None) -> list[Value]:
        node = self.add_node(Op.SPLIT, (x,), {"axis": normalize_axis(Op.SPLIT, axis, len(x.shape)),
                                              "sizes": tuple(int(s) for s in sizes)}, name)
        return list(node.outputs)

    def pad(self, x: Value, pads: Sequence[tuple[int, int]], name: str | None = None) -> Value:
        """Zero padding: pads[i] = (before, after) elements on axis i."""
        return self._op(Op.PAD, x, name=name,
                        pads=tuple((int(b), int(a)) for b, a in pads))

    def slice(self, x: Value, begin: Sequence[int], size: Sequence[int],
              name: str | None = None) -> Value:
        return self._op(Op.SLICE, x, name=name, begin=tuple(int(b) for b in begin),
                        size=tuple(int(s) for s in size))


Rule = Callable[[Graph, Node, list[Value]], list[Value] | None]
VJPRule = Callable[["Graph", list[Value], Value], list[Value | None]]


def copy_node(g: Graph, node: Node, inputs: Sequence[Value]) -> list[Value]:
    """Appends a copy of `node` (from another graph) reading `inputs`; keeps its name
    and composite group."""
    new = g.add_node(node.op, inputs, node.attrs, node.name, node.group, exact_name=True)
    return list(new.outputs)


def rebuild(g: Graph, rule: Rule | None = None, name: str | None = None) -> Graph:
    """A new graph made by visiting `g`'s nodes in order. `rule(new, node, inputs)`
    returns the replacement results of `node` built in `new`, or None to copy it.
    Outputs keep their names."""
    new = Graph(name or g.name)
    vmap: dict[Value, Value] = {}
    for node in g.nodes:
        ins = [vmap[v] for v in node.inputs]
        res = rule(new, node, ins) if rule is not None else None
        if res is None:
            res = copy_node(new, node, ins)
        if len(res) != len(node.outputs):
            raise InvalidArgumentError(f"rewrite of {node.name} gave {len(res)} results, "
                                       f"expected {len(node.outputs)}")
        for old, v in zip(node.outputs, res, strict=True):
            if old.type != v.type:
                raise ShapeError(f"rewrite of {node.name} changed its type {old.type} -> {v.type}")
            vmap[old] = v
    for out_name, v in g.outputs.items():
        new.output(out_name, vmap[v])
    return new


def live_nodes(g: Graph) -> set[Node]:
    """Nodes that some output depends on."""
    live: set[Node] = set()
    stack = [v.node for v in g.outputs.values()]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(v.node for v in n.inputs)
    return live


def prune(g: Graph, keep_inputs: bool = True) -> Graph:
    """Drops nodes no output depends on (inputs stay unless keep_inputs is False)."""
    live = live_nodes(g)
    new = Graph(g.name)
    vmap: dict[Value, Value] = {}
    for node in g.nodes:
        if node in live or (keep_inputs and node.op is Op.INPUT):
            for old, v in zip(node.outputs, copy_node(new, node, [vmap[i] for i in node.inputs]),
                              strict=True):
                vmap[old] = v
    for out_name, v in g.outputs.items():
        new.output(out_name, vmap[v])
    return new


def _frozen(a: np.ndarray) -> bool:
    """Read-only, and so is the array that owns its memory (a view of a writable array
    could still change under the graph)."""
    while isinstance(a.base, np.ndarray) and not a.flags.writeable:
        a = a.base
    return not a.flags.writeable and a.flags.owndata
