"""One lowered graph made runnable: compiled onto a backend (vane, ane), or evaluated by
the IR's numpy reference with fp16 rounding between ops (`backend="reference"`, the
stand-in where no C library is built). Both expose the same two operations the
training step needs: `run(feeds)` and, for baked weights, `patch(values)`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orion.errors import InvalidArgumentError
from orion.ir.compile import CompiledGraph, Lowered, StagedFeeds, compile_lowered, lower_graph
from orion.ir.graph import Graph
from orion.ir.legalize import legalize_graph, legalize_program
from orion.ir.ops import Op
from orion.ir.partition import Plan, execute, partition
from orion.ir.program import ProgramIR, copy_into, from_device, to_device

REFERENCE = "reference"


def _fp16_program(p: ProgramIR, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A legalized program on the numpy reference, with device I/O and fp16 rounding."""
    from orion.ir.reference import evaluate

    dev = {s.name: to_device(s, np.asarray(feeds[s.source], np.float32)) for s in p.inputs}
    out = evaluate(p.graph, dev, round_fp16=True)
    return {s.source: from_device(s, out[s.name].astype(np.float16)).astype(np.float32)
            for s in p.outputs}


class HostStaged:
    """The reference backend's staged inputs: copies, merged into the feeds of a run."""

    def __init__(self, values: Mapping[str, np.ndarray]) -> None:
        self.names = frozenset(values)
        self.values: dict[str, np.ndarray] = {}
        self.write(values)

    def write(self, values: Mapping[str, np.ndarray]) -> None:
        if set(values) != self.names:
            raise InvalidArgumentError(f"staged inputs are {sorted(self.names)}, got "
                                       f"{sorted(values)}")
        self.values = {k: np.array(v) for k, v in values.items()}

    def release(self) -> None:
        self.values = {}


class GraphRunner:
    """A graph lowered once; `compiles` is how many device compiles it spent."""

    def __init__(self, graph: Graph, backend: str | None) -> None:
        self.graph_name = graph.name
        self.backend = backend or "vane"
        self.lowered: Lowered | None = None
        self.compiled: CompiledGraph | None = None
        if self.backend == REFERENCE:  # legalized and partitioned, never emitted
            self.plan: Plan = partition(legalize_graph(graph))
            self.plan.stages = [legalize_program(s) if isinstance(s, ProgramIR) else s
                                for s in self.plan.stages]
        else:
            self.lowered = lower_graph(graph)
            self.plan = self.lowered.plan
            self.compiled = compile_lowered(self.lowered, backend=backend)
        self.compiles = len(self.plan.programs) if self.compiled is not None else 0

    def stage(self, values: Mapping[str, np.ndarray]) -> StagedFeeds | HostStaged:
        """Inputs written once for many runs (`run(..., staged=)`); `write` rewrites them."""
        if self.compiled is not None:
            return self.compiled.stage(values)
        return HostStaged(values)

    def run(self, feeds: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None,
            staged: StagedFeeds | HostStaged | None = None) -> dict[str, np.ndarray]:
        """Outputs by name; those named in `out` are written into its arrays."""
        if self.compiled is not None:
            if isinstance(staged, HostStaged):
                raise InvalidArgumentError("inputs staged for the reference backend")
            return self.compiled.run(feeds, out, staged)
        if isinstance(staged, HostStaged):
            feeds = {**feeds, **staged.values}
        elif staged is not None:
            raise InvalidArgumentError("inputs staged on a device, run on the reference backend")
        result = execute(self.plan, feeds, _fp16_program)
        for k, buf in (out or {}).items():
            result[k] = copy_into(k, buf, result[k])
        return result

    def const_names(self) -> set[str]:
        if self.lowered is not None:
            return {n for em in self.lowered.emitted for n in em.weight_offsets}
        return {n.name for p in self.plan.programs for n in p.graph.nodes
                if n.op is Op.CONST and n.attrs["value"].ndim >= 1}

    def patch(self, values: Mapping[str, np.ndarray]) -> int:
        """Delta update: every baked const named in `values` rewritten in place
        (unload -> patch -> load, no compile). Returns the bytes written."""
        written = 0
        if self.lowered is None:  # the reference reads consts from the program graphs
            for prog in self.plan.programs:
                for node in prog.graph.nodes:
                    if node.op is Op.CONST and node.name in values:
                        v = np.asarray(values[node.name], np.float16).astype(np.float32)
                        v = v.reshape(node.attrs["value"].shape)
                        v.setflags(write=False)
                        node.attrs["value"] = v
                        written += v.size * 2
            return written
        assert self.compiled is not None
        for i, em in enumerate(self.lowered.emitted):
            patches: dict[str, dict[int, np.ndarray]] = {}
            for name, (key, offset) in em.weight_offsets.items():
                if name in values:
                    arr = np.ascontiguousarray(values[name], np.float16)
                    patches.setdefault(key, {})[offset] = arr
                    written += arr.nbytes
            if patches:
                self.compiled.programs[i].update_weights(patches)
        return written

    def release(self) -> None:
        if self.compiled is not None:
            self.compiled.release()
            self.compiled = None
