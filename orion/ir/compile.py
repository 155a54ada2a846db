"""From a graph to loaded programs, and running them chained through surfaces.

    lowered = lower_graph(g)            # legalize -> partition -> legalize programs -> emit
    with compile_graph(g) as model:     # ... -> Program.compile -> load
        outputs = model.run({"x": x})

A value passed from one program to the next stays in the producer's output surface when
the consumer's input has the same device tensor (shape and placement): the consumer binds
that very surface, and nothing is copied on the host. Otherwise the value is copied from
one surface to the other. `chain_stats` says which happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np

from orion.errors import InternalError, InvalidArgumentError
from orion.ir.graph import Graph
from orion.ir.legalize import legalize_graph, legalize_program
from orion.ir.mil import EmittedProgram, emit
from orion.ir.partition import DeviceLimits, HostConcat, Plan, partition
from orion.ir.program import IOSpec, ProgramIR, copy_into, from_device, to_device


@dataclass
class Lowered:
    """A graph compiled down to MIL: the plan (its programs legalized) and, for each
    program in order, its MIL text and weight blob."""

    plan: Plan
    emitted: list[EmittedProgram]


def lower_graph(g: Graph, limits: DeviceLimits | None = None, *,
                share_weights: bool = False, weights_folder: Path | None = None) -> Lowered:
    """The one lowering pipeline: whole-graph passes, the partitioner, program passes,
    MIL (`share_weights`, `weights_folder`: see `orion.ir.mil.emit`)."""
    plan = partition(legalize_graph(g), limits)
    plan.stages = [legalize_program(s) if isinstance(s, ProgramIR) else s for s in plan.stages]
    return Lowered(plan, [emit(p, share_weights=share_weights, weights_folder=weights_folder)
                          for p in plan.programs])


@dataclass
class ChainStats:
    shared: int = 0     # program inputs bound to the producing program's output surface
    copied: int = 0     # program inputs filled by a host copy from another surface
    fed: int = 0        # program inputs written from the caller's arrays


@dataclass
class _Binding:
    program: object                      # orion.runtime.Program
    inputs: list[tuple[IOSpec, object, bool]]   # spec, Surface, filled by a host copy
    outputs: list[tuple[IOSpec, object]]


def _feed(value: np.ndarray) -> np.ndarray:
    """A model input as the device copy takes it: fp16 as it is (e.g. staged weights;
    a round trip through fp32 would only cost two conversions), else fp32."""
    if isinstance(value, np.ndarray) and value.dtype == np.float16:
        return value
    return np.asarray(value, np.float32)


class StagedFeeds:
    """Model inputs written once into surfaces of their own, for many runs (e.g. one
    layer's weights when weights are program inputs: each layer keeps its surfaces and
    a weight update rewrites them, instead of every run copying them in again)."""

    def __init__(self, graph: CompiledGraph, values: Mapping[str, np.ndarray]) -> None:
        from orion.runtime import Surface

        plan = graph.lowered.plan
        self.graph, self.names = graph, frozenset(values)
        unknown = self.names - set(plan.inputs)
        if unknown:
            raise InvalidArgumentError(f"{sorted(unknown)} are not inputs of {graph.name}")
        on_host = {s for st in plan.stages if isinstance(st, HostConcat) for s in st.inputs}
        on_host |= set(plan.outputs.values())
        if self.names & on_host:
            raise InvalidArgumentError(f"{sorted(self.names & on_host)} are read on the host too "
                                       "and cannot live in staged surfaces only")
        # (binding index, input index) -> (spec, surface): each program input the
        # staged values fill, exactly as run() would fill it from the feeds
        self.surfaces: dict[tuple[int, int], tuple[IOSpec, object]] = {}
        try:
            for bi, b in enumerate(graph.bindings()):
                for ii, (spec, _, fill) in enumerate(b.inputs):
                    if fill and spec.source in self.names:
                        self.surfaces[bi, ii] = (spec, Surface(spec.device_nbytes))
            self.write(values)
        except BaseException:
            self.release()
            raise

    def write(self, values: Mapping[str, np.ndarray]) -> None:
        """Rewrites the staged inputs (the same names as staged)."""
        if set(values) != self.names:
            raise InvalidArgumentError(f"staged inputs are {sorted(self.names)}, got "
                                       f"{sorted(values)}")
        for spec, surface in self.surfaces.values():
            to_device(spec, _feed(values[spec.source]),
                      surface.numpy(np.float16, spec.device_shape))

    def release(self) -> None:
        for _, surface in self.surfaces.values():
            surface.release()
        self.surfaces = {}


@dataclass
class CompiledGraph:
    lowered: Lowered
    programs: list = field(default_factory=list)     # orion.runtime.Program, plan order
    chain_stats: ChainStats = field(default_factory=ChainStats)
    _bindings: list[_Binding] | None = None

    # ---- life cycle ------------------------------------------------------------------

    def load(self) -> None:
        for p in self.programs:
            if not p.loaded:
                p.load()

    def unload(self) -> None:
        for p in self.programs:
            if p.loaded:
                p.unload()

    def release(self) -> None:
        for b in self._bindings or []:
            for _, s, _ in b.inputs:
                s.release()
            for _, s in b.outputs:
                s.release()
        self._bindings = None
        for p in self.programs:
            p.release()
        self.programs = []

    def __enter__(self) -> CompiledGraph:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    # ---- running -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.lowered.plan.programs[0].name if self.lowered.plan.programs else "graph"

    def bindings(self) -> list[_Binding]:
        if self._bindings is None:
            self._bindings = self._bind()
        return self._bindings

    def stage(self, values: Mapping[str, np.ndarray]) -> StagedFeeds:
        """Surfaces of their own holding these model inputs, for `run(..., staged=)`."""
        return StagedFeeds(self, values)

    def _bind(self) -> list[_Binding]:
        from orion.runtime import Surface

        produced: dict[str, tuple[IOSpec, object]] = {}
        bindings, stats = [], ChainStats()
        for em, prog in zip(self.lowered.emitted, self.programs, strict=True):
            names = [io.name for io in prog.inputs], [io.name for io in prog.outputs]
            if names != ([s.name for s in em.inputs], [s.name for s in em.outputs]):
                raise InternalError(f"program {em.name}: the device binds {names}, the "
                                   "compiler declared another order (ANE-C19/C20)")
            ins = []
            for spec in em.inputs:
                src = produced.get(spec.source)
                if src is not None and (src[0].device_shape, src[0].block) == \
                        (spec.device_shape, spec.block):
                    ins.append((spec, src[1], False))
                    stats.shared += 1
                else:
                    ins.append((spec, Surface(spec.device_nbytes), True))
                    if src is not None:
                        stats.copied += 1
                    else:
                        stats.fed += 1
            outs = [(spec, Surface(spec.device_nbytes)) for spec in em.outputs]
            for spec, s in outs:
                produced[spec.source] = (spec, s)
            bindings.append(_Binding(prog, ins, outs))
        self.chain_stats = stats
        return bindings

    def run(self, feeds: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None,
            staged: StagedFeeds | None = None) -> dict[str, np.ndarray]:
        """Model outputs (float32) for model inputs by name. Outputs named in `out` are
        written into its arrays (float32, C-contiguous, the outputs' shapes) and
        returned as those arrays. Inputs in `staged` (from `stage`) are bound from its
        surfaces and left out of `feeds`."""
        plan = self.lowered.plan
        staged_names = staged.names if staged is not None else frozenset()
        if set(feeds) & staged_names or set(feeds) | staged_names != set(plan.inputs):
            raise InvalidArgumentError(f"inputs are {sorted(plan.inputs)}, got {sorted(feeds)}"
                                       + (f" and staged {sorted(staged_names)}" if staged else ""))
        if staged is not None and staged.graph is not self:
            raise InvalidArgumentError("staged inputs of another graph")
        own = staged.surfaces if staged is not None else {}
        self.load()
        env: dict[str, np.ndarray] = {k: _feed(v) for k, v in feeds.items()}
        env.update({k: np.asarray(v, np.float32) for k, v in plan.consts.items()})
        surfaces: dict[str, tuple[IOSpec, object]] = {}

        def value(src: str) -> np.ndarray:
            if src not in env:
                spec, s = surfaces[src]
                env[src] = from_device(spec, s.numpy(np.float16, spec.device_shape))
            return env[src]

        bindings = iter(enumerate(self.bindings()))
        for st in plan.stages:
            if isinstance(st, HostConcat):
                env[st.output] = np.concatenate([value(s) for s in st.inputs], axis=st.axis)
                continue
            bi, b = next(bindings)
            ins = []
            for ii, (spec, s, fill) in enumerate(b.inputs):
                if (bi, ii) in own:
                    s = own[bi, ii][1]
                elif fill:
                    to_device(spec, value(spec.source), s.numpy(np.float16, spec.device_shape))
                ins.append(s)
            b.program.eval(ins, [s for _, s in b.outputs])
            for spec, s in b.outputs:
                env.pop(spec.source, None)
                surfaces[spec.source] = (spec, s)
        out = out or {}
        result = {}
        for k, src in plan.outputs.items():
            if k in out and src in surfaces:
                spec, s = surfaces[src]
                result[k] = from_device(spec, s.numpy(np.float16, spec.device_shape), out[k])
            elif k in out:
                result[k] = copy_into(k, out[k], value(src))
            else:
                result[k] = value(src)
        return result


def compile_lowered(lowered: Lowered, backend: str | None = None, numerics: str = "fp16",
                    load: bool = True) -> CompiledGraph:
    from orion.runtime import Program

    cg = CompiledGraph(lowered)
    try:
        for em in lowered.emitted:
            cg.programs.append(Program.compile(em.mil, em.weights, backend=backend,
                                               numerics=numerics))
            if load:
                cg.programs[-1].load()
    except BaseException:
        cg.release()
        raise
    return cg


def compile_graph(g: Graph, limits: DeviceLimits | None = None, backend: str | None = None,
                  numerics: str = "fp16", load: bool = True) -> CompiledGraph:
    """Legalizes, partitions, emits, compiles and (by default) loads every program."""
    return compile_lowered(lower_graph(g, limits), backend, numerics, load)
