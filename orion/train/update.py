"""The compiled training programs of one model, and the two weight-update strategies
behind one option (`TrainConfig.update`).

    "delta"   delta reload (the Orion paper, ane-facts §4.2): every block program holds
              its weights as baked consts; after an optimizer step each program is
              unloaded, its blob entries are overwritten in place with the new fp16
              weights, and it is loaded again. 2 programs per layer (and 2 for the final
              norm) are compiled once.
    "inputs"  weights as inputs (§4.3, maderix's dynamic pipeline): one program per
              kind of block serves every layer of that kind; each layer keeps its fp16
              weights in input surfaces of its own, and an update rewrites them (once a
              step, not at every evaluation).

Neither compiles after setup: `compiles` is fixed when the programs are built, and the
compile budget (ANE-C31) is checked against it before anything is compiled.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from orion.errors import CompileBudgetError, InternalError, InvalidArgumentError
from orion.ir.compile import StagedFeeds
from orion.models.architecture import Architecture
from orion.runtime.fp16 import to_fp16
from orion.train.programs import FINAL, BlockPrograms, LoraSpec, block_programs, slot_value
from orion.train.runner import REFERENCE, GraphRunner, HostStaged

STRATEGIES = ("delta", "inputs")
PATCH_THREADS = 2       # programs patched and reloaded at once by a delta update
_instances = itertools.count()


def default_strategy(backend: str) -> str:
    """"inputs" on ane: public evidence says the device serves a cached program after a
    delta reload (docs/ane-backend.md), so until a Mac run shows the delta path works,
    weights go in as inputs there; "delta" elsewhere."""
    return "inputs" if backend == "ane" else "delta"


def instance_tag() -> str:
    """Unique per process and per TrainPrograms: program folders are content-addressed
    (MIL text + weight keys) and shared by every process that compiles the same text,
    so two runs patching "the same" program in place would write into one another."""
    return f"p{os.getpid():x}n{next(_instances)}"


def block_kind(arch: Architecture, block: int) -> object:
    """What makes two blocks' programs the same graph when weights are inputs: the final
    norm, or a layer's attention (its window and rotation)."""
    return "final" if block == FINAL else ("layer", arch.attention(block))


class TrainPrograms:
    """The compiled forward and backward programs of every block, and how their
    weights change. `run(("fwd" | "bwd", block), feeds)` evaluates one."""

    def __init__(self, arch: Architecture, weights: Mapping[str, np.ndarray], seq: int,
                 strategy: str | None, backend: str | None = None,
                 lora: LoraSpec | None = None) -> None:
        from orion.runtime import resolve_backend

        self.backend = backend if backend == REFERENCE else resolve_backend(backend)
        strategy = strategy or default_strategy(self.backend)
        if strategy not in STRATEGIES:
            raise InvalidArgumentError(f"update strategy must be one of {STRATEGIES}, not "
                                       f"{strategy!r}")
        self.arch, self.seq, self.strategy, self.lora = arch, seq, strategy, lora
        self.blocks = [*range(arch.args.n_layers), FINAL]
        self.graphs: dict[int, BlockPrograms] = {}
        self.runners: dict[tuple[str, int], GraphRunner] = {}
        # inputs strategy: each block's fp16 weights in surfaces of their own, written by
        # `update` (once a step) rather than copied in by every run
        self.staged: dict[tuple[str, int], StagedFeeds | HostStaged] = {}
        self._half: dict[str, np.ndarray] = {}                 # fp16 copy of each parameter
        self._patch_pool: ThreadPoolExecutor | None = None
        try:
            self._build(weights)
        except BaseException:
            self.release()
            raise
        self.compiles = sum(r.compiles for r in set(self.runners.values()))
        self.last_update_ms = 0.0

    def _kinds(self) -> int:
        return len({block_kind(self.arch, b) for b in self.blocks})

    def _check_budget(self, per_program: int) -> None:
        if self.backend == REFERENCE:
            return
        from orion.runtime import compile_budget, compile_count

        n = 2 * (len(self.blocks) if self.strategy == "delta" else self._kinds())
        need, left = n * per_program, compile_budget() - compile_count()
        if need > left:
            raise CompileBudgetError(
                f"{need} programs ({self.strategy} strategy) would exceed the {left} compiles "
                "left in this process's budget (ANE-C31); use update='inputs', which "
                f"compiles {2 * self._kinds() * per_program}")

    def _build(self, weights: Mapping[str, np.ndarray]) -> None:
        tag = instance_tag()
        shared: dict[tuple[str, object], GraphRunner] = {}
        for block in self.blocks:
            bp = block_programs(self.arch, weights, block, self.seq, self.strategy, tag,
                                self.lora)
            if not self.graphs:
                self._check_budget(1)
            self.graphs[block] = bp
            for which, graph in (("fwd", bp.forward), ("bwd", bp.backward)):
                if self.strategy == "delta":
                    runner = GraphRunner(graph, self.backend)
                    missing = {s.name for s in bp.slots[which]} - runner.const_names()
                    if missing:
                        raise InternalError(f"{graph.name}: weights {sorted(missing)} are "
                                           "not baked consts of the lowered programs")
                else:
                    key = (which, block_kind(self.arch, block))
                    runner = shared.get(key) or GraphRunner(graph, self.backend)
                    shared[key] = runner
                self.runners[which, block] = runner
            for s in bp.slots["fwd"]:
                if s.param not in self._half:
                    self._half[s.param] = np.empty(np.shape(weights[s.param]), np.float16)
        if self.strategy == "inputs":
            self.update(weights)

    def run(self, which: str, block: int, feeds: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """One program's outputs (into the arrays of `out`, when given)."""
        key = (which, block)
        return self.runners[key].run(feeds, out, self.staged.get(key))

    @property
    def half(self) -> dict[str, np.ndarray]:
        """The fp16 copy of each parameter the programs compute with, kept from step to
        step (fresh arrays would fault in their pages every step). An optimizer may
        write them in its own pass (`AdamW.step(..., half=programs.half)`) and then
        call `update(weights, rounded=True)` before the programs run again."""
        return self._half

    def update(self, weights: Mapping[str, np.ndarray], rounded: bool = False) -> float:
        """Makes the programs compute with `weights` (fp32 masters, rounded to fp16;
        with `rounded`, `half` already holds them rounded). Returns the wall time in ms."""
        t0 = time.perf_counter()
        half = self._half
        if not rounded:
            for name, buf in half.items():
                to_fp16(weights[name], out=buf)
        patches = []
        for (which, block), runner in self.runners.items():
            slots = self.graphs[block].slots[which]
            values = {s.name: slot_value(s, half, weights) for s in slots}
            if self.strategy == "delta":
                patches.append((runner, values))
            elif (which, block) in self.staged:
                self.staged[which, block].write(values)
            else:
                self.staged[which, block] = runner.stage(values)
        if patches:
            # unload, pwrite, reload: copies the kernel makes on one core each, so two
            # programs at a time (the C calls release the GIL)
            if self._patch_pool is None:
                self._patch_pool = ThreadPoolExecutor(PATCH_THREADS, "orion-patch")
            list(self._patch_pool.map(lambda job: job[0].patch(job[1]), patches))
        self.last_update_ms = (time.perf_counter() - t0) * 1e3
        return self.last_update_ms

    def release(self) -> None:
        if self._patch_pool is not None:
            self._patch_pool.shutdown()
            self._patch_pool = None
        for st in self.staged.values():
            st.release()
        self.staged.clear()
        for r in set(self.runners.values()):
            r.release()
        self.runners.clear()
