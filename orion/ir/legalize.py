"""Legalization: the passes that make a graph acceptable to the ANE.

Each pass works around one device constraint and is named for what it does; each has a
check that finds the violations it removes, citing the constraint id that vane enforces
(ANE-Cnn, numbered as in ane-facts §5). The pass manager runs them in this fixed order:

on the whole model graph
  1. rewrite_gelu_tanh      ANE-C02  gelu -> 0.5 x (1 + tanh(...)); first, so later
                                     passes see only the ops it expands to
  2. rewrite_rsqrt_as_pow   ANE-C03  rsqrt(x) -> pow(x, -0.5)
  3. insert_fp16_clamps     ANE-C41  clip to +-65504 before every softmax and every
                                     layer/RMS norm; before partitioning, so a clamp
                                     lands in the program of what it protects
then `orion.ir.partition` cuts the graph into programs (it splits at concat, ANE-C01,
and respects the per-program limits), and on each program
  4. materialize_outputs    ANE-C06  every returned variable is a distinct computed
                                     value; one also read inside goes out via identity
  5. layout_channel_first   ANE-C29  every I/O is an fp16 [1, C, 1, S] tensor
  6. pad_io_surfaces        ANE-C22 C23 C24 C17 C18
                                     the last axis a multiple of 32 (64 bytes) and >= 32,
                                     every surface >= 49152 bytes, one byte size for all
                                     inputs and one for all outputs
  7. order_io_by_name       ANE-C19 C20  names in_00.., out_00.. of equal length, so the
                                     device's sorted-name binding is the declared order
The MIL emitter then names every op argument as a const (ANE-C04, `orion.ir.mil`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod

from orion.errors import OrionError
from orion.ir import composites
from orion.ir.graph import Graph, Node, Value, copy_node, rebuild
from orion.ir.ops import Op
from orion.ir.program import IOSpec, ProgramIR
from orion.ir.types import DType, TensorType

FP16_MAX = 65504.0
MIN_SURFACE_BYTES = 49152   # ANE-C23
ROW_ALIGN = 32              # fp16 elements per 64 bytes (ANE-C22); also the minimum width (C24)
CLAMPED_COMPOSITES = ("layer_norm", "rms_norm")


@dataclass(frozen=True)
class Violation:
    constraint: str   # "ANE-C02"
    where: str        # node or I/O name
    message: str

    def __str__(self) -> str:
        return f"{self.constraint} at {self.where}: {self.message}"


class LegalizeError(OrionError, ValueError):
    """A program breaks an ANE constraint no pass can fix; `violations` name each."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations))


# ---- 1. gelu -> tanh form (ANE-C02) -------------------------------------------


def rewrite_gelu_tanh(g: Graph) -> Graph:
    def rule(new: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        if node.op is not Op.GELU:
            return None
        return [composites.gelu_tanh(new, ins[0], name=node.name)]
    return rebuild(g, rule)


def check_no_gelu(g: Graph) -> list[Violation]:
    return [Violation("ANE-C02", n.name, "gelu is not accepted; use the tanh form")
            for n in g.nodes if n.op is Op.GELU]


# ---- 2. rsqrt -> pow (ANE-C03) --------------------------------------------------


def rewrite_rsqrt_as_pow(g: Graph) -> Graph:
    def rule(new: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        if node.op is not Op.RSQRT:
            return None
        with new.scope(node.name):
            exponent = new.const(-0.5, name="exp")
        return [new.add_node(Op.POW, (ins[0], exponent), {}, node.name, node.group,
                             exact_name=True).out]
    return rebuild(g, rule)


def check_no_rsqrt(g: Graph) -> list[Violation]:
    return [Violation("ANE-C03", n.name, "rsqrt fails on the device; use pow(x, -0.5)")
            for n in g.nodes if n.op is Op.RSQRT]


# ---- 3. fp16-range clamps (ANE-C41) ------------------------------------------------


def _clamp_sites(g: Graph) -> dict[Node, set[int]]:
    """For each node, the operand positions that must read a clamped value: the input
    of every softmax, and the input x of every layer/RMS norm composite (its operands
    made outside the composite, consts aside)."""
    sites: dict[Node, set[int]] = {}
    for n in g.nodes:
        if n.op is Op.SOFTMAX:
            sites.setdefault(n, set()).add(0)
        elif n.group is not None and n.group[0] in CLAMPED_COMPOSITES:
            for i, v in enumerate(n.inputs):
                if v.node.group != n.group and v.node.op is not Op.CONST:
                    sites.setdefault(n, set()).add(i)
    return sites


def _is_fp16_clamp(v: Value) -> bool:
    n = v.node
    return n.op is Op.CLIP and n.attrs["lo"] >= -FP16_MAX and n.attrs["hi"] <= FP16_MAX


def insert_fp16_clamps(g: Graph) -> Graph:
    sites = _clamp_sites(g)
    clamped: dict[Value, Value] = {}   # new value -> its clamp, one clamp per value

    def rule(new: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        if node not in sites:
            return None
        args = list(ins)
        for i in sorted(sites[node]):
            if _is_fp16_clamp(node.inputs[i]):
                continue
            v = args[i]
            if v not in clamped:
                clamped[v] = new.clip(v, -FP16_MAX, FP16_MAX, name=f"{v.name}_clamp")
            args[i] = clamped[v]
        return copy_node(new, node, args)
    return rebuild(g, rule)


def check_fp16_clamps(g: Graph) -> list[Violation]:
    out = []
    for n, positions in _clamp_sites(g).items():
        for i in sorted(positions):
            if not _is_fp16_clamp(n.inputs[i]):
                what = "softmax" if n.op is Op.SOFTMAX else f"{n.group[0]}#{n.group[1]}"
                out.append(Violation("ANE-C41", n.name, f"input {n.inputs[i].name} of {what} "
                                     "is not clamped to the fp16 range"))
    return out


def check_no_concat(g: Graph) -> list[Violation]:
    return [Violation("ANE-C01", n.name, "concat is rejected by the device compiler; "
                      "partition the graph at it") for n in g.nodes if n.op is Op.CONCAT]


# ---- 4. materialized outputs (ANE-C06) -------------------------------------------


def _output_problem(g: Graph, name: str, v: Value, seen: set[Value],
                    users: dict[Value, list[Node]]) -> str | None:
    if v in seen:
        return "returns a value that another output already returns"
    if v.node.op in (Op.INPUT, Op.CONST):
        return f"returns {v.node.op.value} {v.name} unchanged; it is not computed here"
    if len(g.outputs) > 1 and users[v]:
        return "returns a value that is also read inside the program"
    return None


def check_outputs_materialized(p: ProgramIR) -> list[Violation]:
    g, seen, out = p.graph, set(), []
    users = g.users()
    for name, v in g.outputs.items():
        problem = _output_problem(g, name, v, seen, users)
        if problem:
            out.append(Violation("ANE-C06", name, problem))
        seen.add(v)
    return out


def materialize_outputs(p: ProgramIR) -> ProgramIR:
    g = rebuild(p.graph)
    users, seen = g.users(), set()
    for name, v in list(g.outputs.items()):
        if _output_problem(g, name, v, seen, users):
            g.outputs[name] = g.identity(v, name=f"{name}_out")
        seen.add(g.outputs[name])
    return p.with_(g, p.inputs, p.outputs)


# ---- 5. channel-first fp16 I/O (ANE-C29) -----------------------------------------


def fold_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """[1, C, 1, S] holding a tensor packed row-major: S = last axis, C = the rest."""
    if not shape:
        return (1, 1, 1, 1)
    return (1, prod(shape[:-1]), 1, shape[-1])


def _is_device_type(t: TensorType) -> bool:
    return t.dtype is DType.FP16 and t.rank == 4 and t.shape[0] == 1 and t.shape[2] == 1


def check_io_layout(p: ProgramIR) -> list[Violation]:
    ios = [(v.name, v.type) for v in p.graph.inputs] + \
          [(k, v.type) for k, v in p.graph.outputs.items()]
    return [Violation("ANE-C29", name, f"I/O must be fp16 [1, C, 1, S], is {t}")
            for name, t in ios if not _is_device_type(t)]


def layout_channel_first(p: ProgramIR) -> ProgramIR:
    def rule(new: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        if node.op is not Op.INPUT:
            return None
        t: TensorType = node.attrs["type"]
        if _is_device_type(t):
            return None
        v = new.input(node.name, fold_shape(t.shape))
        with new.scope(node.name):
            v = new.reshape(v, t.shape, name="unfold")
            if t.dtype is not DType.FP16:
                v = new.cast(v, t.dtype, name="dtype")
        return [v]

    g = rebuild(p.graph, rule)
    for name, v in list(g.outputs.items()):
        if not _is_device_type(v.type):
            with g.scope(name):
                if v.dtype is not DType.FP16:
                    v = g.cast(v, DType.FP16, name="dtype")
                v = g.reshape(v, fold_shape(v.shape), name="fold")
            g.outputs[name] = v

    def fold(s: IOSpec) -> IOSpec:
        shape = fold_shape(s.device_shape)
        return replace(s, device_shape=shape, block=(shape[1], shape[3]))
    return p.with_(g, [fold(s) for s in p.inputs], [fold(s) for s in p.outputs])


# ---- 6. surface sizes (ANE-C22, C23, C24, C17, C18) ------------------------------


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def surface_shape(blocks: list[tuple[int, int]]) -> tuple[int, int, int, int]:
    """The one [1, C', 1, S'] that holds every (C, S) block of a group: S' a multiple of
    32, C' so that the surface reaches 49152 bytes."""
    s = max(_round_up(max(s, ROW_ALIGN), ROW_ALIGN) for _, s in blocks)
    c = max(max(c for c, _ in blocks), -(-MIN_SURFACE_BYTES // (2 * s)))
    return (1, c, 1, s)


def check_io_surfaces(p: ProgramIR) -> list[Violation]:
    out = []
    groups = (("input", [(v.name, v.type) for v in p.graph.inputs], "ANE-C18"),
              ("output", [(k, v.type) for k, v in p.graph.outputs.items()], "ANE-C17"))
    for kind, ios, uniform_id in groups:
        for name, t in ios:
            last = t.shape[-1] if t.shape else 1
            if (last * t.dtype.itemsize) % 64:
                out.append(Violation("ANE-C22", name, f"last axis {last} is "
                                     f"{last * t.dtype.itemsize} bytes, not a multiple of 64"))
            if last < ROW_ALIGN:
                out.append(Violation("ANE-C24", name, f"width {last} is below 32"))
            if t.nbytes < MIN_SURFACE_BYTES:
                out.append(Violation("ANE-C23", name, f"{t.nbytes} bytes is below the "
                                     f"{MIN_SURFACE_BYTES}-byte minimum surface"))
        sizes = sorted({t.nbytes for _, t in ios})
        if len(sizes) > 1:
            out.append(Violation(uniform_id, kind + "s", f"{kind} surfaces differ in size: "
                                 f"{sizes} bytes"))
    return out


def pad_io_surfaces(p: ProgramIR) -> ProgramIR:
    if check_io_layout(p):
        raise LegalizeError(check_io_layout(p))
    in_blocks = {v.name: (v.shape[1], v.shape[3]) for v in p.graph.inputs}
    out_blocks = {k: (v.shape[1], v.shape[3]) for k, v in p.graph.outputs.items()}
    in_shape = surface_shape(list(in_blocks.values())) if in_blocks else None
    out_shape = surface_shape(list(out_blocks.values()))

    def rule(new: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        if node.op is not Op.INPUT or node.out.shape == in_shape:
            return None
        c, s = in_blocks[node.name]
        v = new.input(node.name, in_shape)
        with new.scope(node.name):
            return [new.slice(v, (0, 0, 0, 0), (1, c, 1, s), name="block")]

    g = rebuild(p.graph, rule)
    for name, v in list(g.outputs.items()):
        if v.shape != out_shape:
            c, s = out_blocks[name]
            with g.scope(name):
                g.outputs[name] = g.pad(v, ((0, 0), (0, out_shape[1] - c), (0, 0),
                                            (0, out_shape[3] - s)), name="surface")

    def resize(s: IOSpec, shape: tuple[int, ...] | None) -> IOSpec:
        return replace(s, device_shape=shape) if shape is not None else s
    return p.with_(g, [resize(s, in_shape) for s in p.inputs],
                   [resize(s, out_shape) for s in p.outputs])


# ---- 7. binding order (ANE-C19, ANE-C20) -----------------------------------------


def io_names(prefix: str, n: int) -> list[str]:
    width = max(2, len(str(max(n - 1, 0))))
    return [f"{prefix}_{i:0{width}d}" for i in range(n)]


def _names_problem(names: list[str]) -> str | None:
    if len({len(n) for n in names}) > 1:
        return f"names {names} differ in length, so sorted-name binding is ambiguous"
    if names != sorted(names):
        return f"names {names} are not declared in the sorted order the device binds"
    return None


def check_io_names(p: ProgramIR) -> list[Violation]:
    out = []
    for cid, names in (("ANE-C20", [v.name for v in p.graph.inputs]),
                       ("ANE-C19", list(p.graph.outputs))):
        problem = _names_problem(names)
        if problem:
            out.append(Violation(cid, ", ".join(names), problem))
    return out


def order_io_by_name(p: ProgramIR) -> ProgramIR:
    old = p.graph
    new_in = dict(zip([v.name for v in old.inputs], io_names("in", len(old.inputs)),
                      strict=True))
    new_out = dict(zip(old.outputs, io_names("out", len(old.outputs)), strict=True))
    g = Graph(old.name)
    vmap: dict[Value, Value] = {}
    for v in old.inputs:   # inputs first, so no other node can take their names
        vmap[v] = g.add_node(Op.INPUT, (), v.node.attrs, new_in[v.name], exact_name=True).out
    for n in old.nodes:
        if n.op is not Op.INPUT:
            for o, r in zip(n.outputs, copy_node(g, n, [vmap[i] for i in n.inputs]),
                            strict=True):
                vmap[o] = r
    for k, v in old.outputs.items():
        g.outputs[new_out[k]] = vmap[v]
    by_in = {s.name: s for s in p.inputs}
    by_out = {s.name: s for s in p.outputs}
    return p.with_(g, [replace(by_in[k], name=new_in[k]) for k in new_in],
                   [replace(by_out[k], name=new_out[k]) for k in new_out])


# ---- the pass manager ---------------------------------------------------------------


@dataclass(frozen=True)
class Pass:
    name: str
    constraints: tuple[str, ...]
    run: Callable
    check: Callable


GRAPH_PASSES: tuple[Pass, ...] = (
    Pass("rewrite_gelu_tanh", ("ANE-C02",), rewrite_gelu_tanh, check_no_gelu),
    Pass("rewrite_rsqrt_as_pow", ("ANE-C03",), rewrite_rsqrt_as_pow, check_no_rsqrt),
    Pass("insert_fp16_clamps", ("ANE-C41",), insert_fp16_clamps, check_fp16_clamps),
)
PROGRAM_PASSES: tuple[Pass, ...] = (
    Pass("materialize_outputs", ("ANE-C06",), materialize_outputs, check_outputs_materialized),
    Pass("layout_channel_first", ("ANE-C29",), layout_channel_first, check_io_layout),
    Pass("pad_io_surfaces", ("ANE-C22", "ANE-C23", "ANE-C24", "ANE-C17", "ANE-C18"),
         pad_io_surfaces, check_io_surfaces),
    Pass("order_io_by_name", ("ANE-C19", "ANE-C20"), order_io_by_name, check_io_names),
)


def legalize_graph(g: Graph) -> Graph:
    """Runs the whole-graph passes in order; the result has no gelu or rsqrt and every
    softmax and norm input clamped."""
    for p in GRAPH_PASSES:
        g = p.run(g)
    violations = [v for p in GRAPH_PASSES for v in p.check(g)]
    if violations:
        raise LegalizeError(violations)
    return g


def check_program(p: ProgramIR) -> list[Violation]:
    g = p.graph
    return (check_no_concat(g) + check_no_gelu(g) + check_no_rsqrt(g)
            + [v for ps in PROGRAM_PASSES for v in ps.check(p)])


def legalize_program(p: ProgramIR) -> ProgramIR:
    """Runs the program passes in order; raises LegalizeError if anything is left that
    no pass can fix (concat inside a program, for instance)."""
    for ps in PROGRAM_PASSES:
        p = ps.run(p)
    violations = check_program(p)
    if violations:
        raise LegalizeError(violations)
    return p
