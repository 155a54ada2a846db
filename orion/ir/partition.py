"""Partitioning: cut a model-sized graph into programs the device can hold.

The graph's compute nodes are taken in order and packed greedily into programs, each
within `DeviceLimits`. When the next node does not fit, the program is cut at its
narrowest point in its second half (the fewest bytes crossing to later programs; in a
transformer that is the residual stream between layers), and what follows the cut
starts the next program. Constants travel with the programs that read them.

`concat` is never put in a program (ANE-C01): the graph is split there, the parts leave
their programs as outputs, and a host stage joins them. On the channel axis of a
[1, C, 1, S] tensor that join is a plain copy of each part to its offset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from orion.errors import OrionError
from orion.ir.graph import Graph, Node, Value, copy_node
from orion.ir.ops import Op
from orion.ir.program import IOSpec, ProgramIR
from orion.ir.quant import QuantTensor
from orion.ir.types import TensorType


@dataclass(frozen=True)
class DeviceLimits:
    """What one program may hold. Defaults follow ane-facts §5:

    max_weight_bytes  32 MiB: the M4 SRAM (ANE-C45; throughput falls beyond it), and far
                      inside the ~4 GiB weight window (ANE-C35) and 32-bit offsets (C36)
    max_ops           256 ops: the facts give no hard op limit; deep programs of 16-64 ops
                      run best (ANE-C44), and a bound keeps each compile short (C47)
    max_programs      127 resident programs per process (ANE-C34)
    """

    max_weight_bytes: int = 32 * 2**20
    max_ops: int = 256
    max_programs: int = 127


class PartitionError(OrionError, ValueError):
    """A graph cannot be cut into programs within the device limits."""


@dataclass
class HostConcat:
    """A concat done on the host between programs (ANE-C01)."""

    inputs: list[str]          # source names
    axis: int
    output: str
    type: TensorType


Stage = ProgramIR | HostConcat


@dataclass
class Plan:
    """Programs and host stages in execution order, with the model's I/O."""

    name: str
    inputs: dict[str, TensorType]
    stages: list[Stage]
    outputs: dict[str, str]                                   # model output -> source
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # sources that are consts

    @property
    def programs(self) -> list[ProgramIR]:
        return [s for s in self.stages if isinstance(s, ProgramIR)]


def _weight_bytes(n: Node) -> int:
    v = n.attrs["value"]
    if isinstance(v, QuantTensor):   # the device holds it compressed
        return v.nbytes
    return 2 * v.size if v.ndim else 0


class _Packer:
    def __init__(self, g: Graph, limits: DeviceLimits) -> None:
        self.g, self.limits = g, limits
        self.seq = [n for n in g.nodes if n.op not in (Op.INPUT, Op.CONST)]
        self.pos = {n: i for i, n in enumerate(self.seq)}
        users = g.users()
        outs = set(g.outputs.values())
        # the last position at which each value is read (len(seq) for graph outputs)
        self.last_use: dict[Value, int] = {}
        for v, us in users.items():
            last = max((self.pos[u] for u in us if u in self.pos), default=-1)
            self.last_use[v] = len(self.seq) if v in outs else last

    def cost(self, nodes: list[Node]) -> tuple[int, int]:
        consts = {v.node for n in nodes for v in n.inputs if v.node.op is Op.CONST}
        return sum(_weight_bytes(c) for c in consts), len(nodes)

    def fits(self, nodes: list[Node]) -> bool:
        wb, ops = self.cost(nodes)
        return wb <= self.limits.max_weight_bytes and ops <= self.limits.max_ops

    def crossing_bytes(self, nodes: list[Node], k: int) -> int:
        """Bytes of values made in nodes[:k+1] and read after it."""
        end = self.pos[nodes[k]]
        return sum(v.type.nbytes for n in nodes[: k + 1] for v in n.outputs
                   if self.last_use[v] > end)

    def best_cut(self, nodes: list[Node]) -> int:
        ks = range(len(nodes) // 2, len(nodes))
        return min(ks, key=lambda k: (self.crossing_bytes(nodes, k), -k))

    def segments(self) -> list[list[Node] | Node]:
        out: list[list[Node] | Node] = []
        cur: list[Node] = []
        i = 0
        while i < len(self.seq):
            n = self.seq[i]
            if n.op is Op.CONCAT:
                if cur:
                    out.append(cur)
                out.append(n)
                cur, i = [], i + 1
                continue
            if self.fits([*cur, n]):
                cur.append(n)
                i += 1
                continue
            if not cur:
                wb, _ = self.cost([n])
                raise PartitionError(
                    f"node {n.name} ({n.op.value}) alone needs {wb} bytes of weights, over the "
                    f"{self.limits.max_weight_bytes}-byte program limit; split the layer")
            k = self.best_cut(cur)
            out.append(cur[: k + 1])
            i -= len(cur) - (k + 1)
            cur = []
        if cur:
            out.append(cur)
        return out


def _program(g: Graph, name: str, nodes: list[Node], later_use: Callable[[Value], bool]
             ) -> ProgramIR:
    """The nodes as one program. Its inputs come in the graph's declared order (then
    values from earlier programs, by first use), its outputs in the graph's output
    order (then values later programs read): a graph that is one program keeps the
    binding order its builder declared (ANE-C20 binds surfaces by that order)."""
    inside = set(nodes)
    pg = Graph(name)
    vmap: dict[Value, Value] = {}
    declared = {v: i for i, v in enumerate(g.inputs)}
    external: list[Value] = []
    for n in nodes:
        for v in n.inputs:
            if v in vmap or v.node in inside or v in external:
                continue
            if v.node.op is Op.CONST:
                vmap[v] = copy_node(pg, v.node, [])[0]
            else:
                external.append(v)
    first_use = {v: i for i, v in enumerate(external)}
    external.sort(key=lambda v: (v not in declared, declared.get(v, 0), first_use[v]))
    inputs: list[IOSpec] = []
    for v in external:
        vmap[v] = pg.input(v.name, v.shape, v.dtype)
        inputs.append(IOSpec(v.name, v.name, v.shape, v.dtype, v.shape))
    for n in nodes:
        for o, r in zip(n.outputs, copy_node(pg, n, [vmap[v] for v in n.inputs]), strict=True):
            vmap[o] = r
    graph_out = {v: i for i, v in enumerate(g.outputs.values())}
    leaving = [o for n in nodes for o in n.outputs if later_use(o)]
    made = {o: i for i, o in enumerate(leaving)}
    leaving.sort(key=lambda o: (o not in graph_out, graph_out.get(o, 0), made[o]))
    outputs: list[IOSpec] = []
    for o in leaving:
        pg.output(o.name, vmap[o])
        outputs.append(IOSpec(o.name, o.name, o.shape, o.dtype, o.shape))
    return ProgramIR(name, pg, inputs, outputs)


def partition(g: Graph, limits: DeviceLimits | None = None) -> Plan:
    """Cuts a legalized graph (`orion.ir.legalize.legalize_graph`) into a plan."""
    limits = limits or DeviceLimits()
    packer = _Packer(g, limits)
    segments = packer.segments()
    stages: list[Stage] = []
    n_prog = sum(isinstance(s, list) for s in segments)
    width = max(2, len(str(n_prog - 1)))
    for seg in segments:
        index = sum(isinstance(s, ProgramIR) for s in stages)
        if isinstance(seg, Node):
            stages.append(HostConcat([v.name for v in seg.inputs], seg.attrs["axis"],
                                     seg.out.name, seg.out.type))
            continue
        end = packer.pos[seg[-1]]
        prog_name = f"{g.name}_p{index:0{width}d}"
        stages.append(_program(g, prog_name, seg, lambda v, end=end: packer.last_use[v] > end))
    if n_prog > limits.max_programs:
        raise PartitionError(f"{n_prog} programs exceed the {limits.max_programs} resident "
                             "programs the device holds (ANE-C34)")
    consts = {v.name: v.node.attrs["value"] for v in g.outputs.values() if v.node.op is Op.CONST}
    return Plan(g.name, {v.name: v.type for v in g.inputs}, stages,
                {k: v.name for k, v in g.outputs.items()}, consts)


# ---- executing a plan -----------------------------------------------------------------

ProgramRunner = Callable[[ProgramIR, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def execute(plan: Plan, feeds: Mapping[str, np.ndarray], run: ProgramRunner
            ) -> dict[str, np.ndarray]:
    """Runs a plan on model values: `run(program, {source: array})` evaluates one program
    (on a device, or with the numpy reference) and returns {source: array}."""
    env: dict[str, np.ndarray] = {k: np.asarray(feeds[k], np.float32) for k in plan.inputs}
    env.update({k: np.asarray(v, np.float32) for k, v in plan.consts.items()})
    for st in plan.stages:
        if isinstance(st, HostConcat):
            env[st.output] = np.concatenate([env[s] for s in st.inputs], axis=st.axis)
        else:
            env.update(run(st, {s.source: env[s.source] for s in st.inputs}))
    return {k: env[src] for k, src in plan.outputs.items()}


def reference_runner(p: ProgramIR, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluates a (not yet legalized) program with the numpy reference."""
    from orion.ir.reference import evaluate

    r = evaluate(p.graph, {s.name: feeds[s.source] for s in p.inputs})
    return {s.source: r[s.name] for s in p.outputs}
