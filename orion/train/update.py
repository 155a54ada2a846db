"""The two weight-update strategies, behind one option (`TrainConfig.update`).

    "delta"   delta reload (the Orion paper, ane-facts §4.2): every layer program holds
              its weights as baked consts; after an optimizer step each program is
              unloaded, its blob entries are overwritten in place with the new fp16
              weights, and it is loaded again. 4 programs per layer are compiled once.
    "inputs"  weights as inputs (§4.3, maderix's dynamic pipeline): weights are program
              inputs, so one program per kind serves every layer; each layer keeps
              its fp16 weights in input surfaces of its own, and an update rewrites
              them (once a step, not at every evaluation).

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

from orion.fp16 import to_fp16, transpose
from orion.ir.compile import StagedFeeds
from orion.models.llama_config import LlamaConfig
from orion.models.llama_programs import KINDS, LinearHook, WeightSlot, build_layer_graph
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
    """Unique per process and per LayerPrograms: program folders are content-addressed
    (MIL text + weight keys) and shared by every process that compiles the same text,
    so two runs patching "the same" program in place would write into one another."""
    return f"p{os.getpid():x}n{next(_instances)}"


class LayerPrograms:
    """The compiled per-layer programs of one model and how their weights change."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray], seq: int,
                 strategy: str | None, backend: str | None = None,
                 lora: LinearHook | None = None) -> None:
        from orion.runtime import resolve_backend

        self.backend = backend if backend == REFERENCE else resolve_backend(backend)
        strategy = strategy or default_strategy(self.backend)
        if strategy not in STRATEGIES:
            raise ValueError(f"update strategy must be one of {STRATEGIES}, not {strategy!r}")
        self.cfg, self.seq, self.strategy = cfg, seq, strategy
        self.lora = lora    # LoRA inputs and products in every program (orion.lora.graph)
        self._check_budget()
        self.runners: dict[tuple[str, int], GraphRunner] = {}
        self.slots: dict[tuple[str, int], list[WeightSlot]] = {}
        # inputs strategy: each layer's fp16 weights in surfaces of their own, written by
        # `update` (once a step) rather than copied in by every run (twice a step)
        self.staged: dict[tuple[str, int], StagedFeeds | HostStaged] = {}
        self._half: dict[str, np.ndarray] = {}                 # fp16 copy of each parameter
        self._transposed: dict[tuple[tuple[str, int], str], np.ndarray] = {}  # W^T copies
        self._patch_pool: ThreadPoolExecutor | None = None
        try:
            self._build(weights)
        except BaseException:
            self.release()
            raise
        self.compiles = sum(r.compiles for r in set(self.runners.values()))
        self.last_update_ms = 0.0

    def _check_budget(self) -> None:
        if self.backend == REFERENCE:
            return
        from orion.errors import CompileBudgetError
        from orion.runtime import compile_budget, compile_count

        per = len(KINDS) * (self.cfg.n_layers if self.strategy == "delta" else 1)
        left = compile_budget() - compile_count()
        if per > left:
            raise CompileBudgetError(
                f"{per} programs ({self.strategy} strategy) would exceed the {left} compiles "
                "left in this process's budget (ANE-C31); use update='inputs', which "
                f"compiles {len(KINDS)}")

    def _build(self, weights: Mapping[str, np.ndarray]) -> None:
        tag = instance_tag()
        for kind in KINDS:
            shared: GraphRunner | None = None
            for layer in range(self.cfg.n_layers):
                mode = "delta" if self.strategy == "delta" else "inputs"
                lg = build_layer_graph(kind, self.cfg, weights, layer, self.seq, mode, tag,
                                       self.lora)
                if self.strategy == "delta":
                    runner = GraphRunner(lg.graph, self.backend)
                    missing = {s.name for s in lg.slots} - runner.const_names()
                    if missing:
                        raise RuntimeError(f"{lg.graph.name}: weights {sorted(missing)} are "
                                           "not baked consts of the lowered programs")
                else:
                    shared = shared or GraphRunner(lg.graph, self.backend)
                    runner = shared
                self.runners[kind, layer] = runner
                self.slots[kind, layer] = lg.slots
                for s in lg.slots:
                    if s.param not in self._half:
                        self._half[s.param] = np.empty(np.shape(weights[s.param]), np.float16)
        if self.strategy == "inputs":
            self.update(weights)

    def run(self, kind: str, layer: int, feeds: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """One layer program's outputs (into the arrays of `out`, when given)."""
        return self.runners[kind, layer].run(feeds, out, self.staged.get((kind, layer)))

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
        if not rounded:     # each parameter once: W and W^T share it
            for name, buf in half.items():
                to_fp16(weights[name], out=buf)
        patches: list[tuple[GraphRunner, dict[str, np.ndarray]]] = []
        for key, slots in self.slots.items():
            values = {}
            for s in slots:
                if s.vector or not s.transpose:
                    values[s.name] = s.value(half, self.cfg)   # a view of the fp16 copy
                    continue
                m = s.matrix(half, self.cfg)                    # W^T: a strided view
                buf = self._transposed.get((key, s.name))
                if buf is None:
                    buf = self._transposed[key, s.name] = np.empty(m.shape, np.float16)
                transpose(m.T, out=buf)                       # m.T: W itself
                values[s.name] = buf.reshape(s.declared_shape(m.shape))
            if self.strategy == "delta":
                patches.append((self.runners[key], values))
            elif key in self.staged:
                self.staged[key].write(values)
            else:
                self.staged[key] = self.runners[key].stage(values)
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
