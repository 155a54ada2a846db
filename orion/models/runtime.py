"""The one runtime of every causal LM: an architecture's programs on a backend.

    model = orion.load("~/models/Qwen3-0.6B")[0]     # a TransformerLM
    logits = model.prefill(ids)
    logits = model.decode(int(logits.argmax()))

The layers run on the backend as prefill programs (the prompt, padded to a bucket)
and decode programs (one token against a KV cache kept in surfaces, holding the
n_kv_heads heads; `orion.models.programs` says what each program is), so a decode step
costs the same at any position of a bucket. Which layers share a program, the buckets
and the classifier's chunks are the plan's (`orion.models.plan`, `model.plan`), made at
load from the device's budgets: a model whose programs cannot fit the compile budget
fails there (PlanError), never in the middle of a generation. The embedding lookup runs
on the host from the memory-mapped weights; the final norm and the classifier run as
head programs for the next-token row, and on the host in fp32 when every position's
logits are asked for. Programs are compiled on first use, one per (kind, layers,
bucket, LoRA signature), or opened from the program store when an earlier process
compiled them (`orion.models.store_keys`), and kept for the life of the model; when
the device cannot hold them all (127 resident programs, ANE-C34; 4 GiB of loaded
weights, ANE-C35) the least recently used are unloaded and loaded again when needed.

A decode token is one C call (`orion.models.decode_sequence`) once its programs are
loaded. A selected LoRA adapter (`load_adapter`, `set_adapter`) is fed to the same
programs through inputs (`orion.models.adapters.KvLora`), its ranks zero-padded to the
plan's rank bucket: selecting another adapter of the same modules and bucket is a
surface write.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import (
    ConstraintError,
    InvalidArgumentError,
    ModelLoadError,
    PlanError,
    StateError,
)
from orion.ir.composites import MASK_VALUE
from orion.ir.graph import Graph
from orion.ir.legalize import surface_shape
from orion.models import programs as P
from orion.models import store_keys
from orion.models.adapters import Adapter, AdapterSet, BatchLora, KvLora, Signature
from orion.models.architecture import Architecture
from orion.models.base import ModelStats, describe_model, prefill_beyond_buckets, smallest_bucket
from orion.models.batch_programs import batch_graph, prompts_graph
from orion.models.blocks import Prefill, RowLayout, Weights
from orion.models.decode_sequence import DecodeSequences, DecodeStep
from orion.models.kv_cache import KVCache
from orion.models.plan import ProgramKey, ProgramPlan, plan_programs
from orion.models.rope import Rope
from orion.models.weights import WeightSource
from orion.runtime.fp16 import to_fp32
from orion.runtime.heap import release_free_heap
from orion.tokenizers.base import Tokenizer

_instances = itertools.count()
_live_tags: set[str] = set()   # tags of this process's open models (their programs' names)
ROPE_BLOCK = 64   # decode positions whose RoPE rows are worked out at once


@dataclass(frozen=True)
class RuntimeOptions:
    """prefill_buckets: padded prompt lengths; a prompt runs at the smallest that holds
                     it (a longer one: the largest, then decode steps). None: the
                     architecture's
    decode_buckets:  KV cache lengths; a step at position p runs at the smallest > p.
                     The largest is the context the model can fill (capped at the
                     model's max_positions). None: the architecture's
    numerics:        "fp16" or "strict" (vane's device-exact arithmetic, ANE-C42)
    program_weight_bytes: the weight bytes one layer program may bake: consecutive
                     layers share a program up to it (`orion.models.plan`). None: the
                     plan's default (512 MiB); 0: one layer a program
    lora_rank_buckets: LoRA ranks programs are compiled for; an adapter's rank rounds
                     up to the smallest that holds it. None: the plan's (32, 64, 128,
                     256); (): each rank its own programs
    reuse_programs:  keep compiled programs in the program store and open them in
                     later processes instead of compiling (docs/planning.md). None:
                     ORION_PROGRAM_STORE ("off" turns it off; on by default)
    """

    prefill_buckets: tuple[int, ...] | None = None
    decode_buckets: tuple[int, ...] | None = None
    numerics: str = "fp16"
    program_weight_bytes: int | None = None
    lora_rank_buckets: tuple[int, ...] | None = None
    reuse_programs: bool | None = None

    @classmethod
    def with_overrides(cls, base: RuntimeOptions | None, overrides: dict[str, Any]
                       ) -> RuntimeOptions:
        base = base or cls()
        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise InvalidArgumentError(f"unknown model options: {', '.join(sorted(unknown))}"
                                       f" (known: {', '.join(sorted(known))})")
        for k in ("prefill_buckets", "decode_buckets"):
            if k in overrides and overrides[k] is not None:
                overrides[k] = _buckets(k, overrides[k])
        if overrides.get("lora_rank_buckets") is not None:
            ranks = overrides["lora_rank_buckets"]
            overrides["lora_rank_buckets"] = _buckets("lora_rank_buckets", ranks) if ranks \
                else ()
        reuse = overrides.get("reuse_programs")
        if reuse is not None and not isinstance(reuse, bool):
            raise InvalidArgumentError(f"reuse_programs must be True, False or None, got "
                                       f"{reuse!r}")
        return replace(base, **overrides)

    def reuses_programs(self) -> bool:
        if self.reuse_programs is not None:
            return self.reuse_programs
        return os.environ.get("ORION_PROGRAM_STORE", "on").lower() not in ("off", "0", "no")


def _buckets(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"{name} must be a sequence of integers, got {value!r}")
    out = tuple(value)
    if not out or any(isinstance(b, bool) or not isinstance(b, int) for b in out):
        raise InvalidArgumentError(f"{name} must be a non-empty sequence of integers, "
                                   f"got {value!r}")
    return out


def _nbytes(shape: tuple[int, ...]) -> int:
    return 2 * int(np.prod(shape))


def build_folder() -> str | None:
    """Where a build writes its weight file for the compile to copy: beside the program
    folders when ORION_CACHE_DIR names one (a large disk where $TMPDIR may be small),
    else the system's temporary folder (where the program folders go by default)."""
    cache = os.environ.get("ORION_CACHE_DIR")
    return cache if cache and os.path.isdir(cache) else None


class TransformerLM:
    """A causal LM of any architecture on a backend (see the module docstring)."""

    def __init__(self, arch: Architecture, weights: WeightSource, tokenizer: Tokenizer | None,
                 *, backend: str | None = None, options: RuntimeOptions | None = None,
                 source: str = "") -> None:
        from orion.runtime import Surface, backends

        self.arch = arch
        a = self.config = arch.args
        self.weights = weights
        self._tokenizer = tokenizer
        self._source = source
        self.stats = ModelStats()
        self.options = options or RuntimeOptions()
        self._backend_request = None if backend == "auto" else backend
        env = os.environ.get("ORION_BACKEND")
        self._backend = backend if backend not in (None, "auto") else (
            env if env and env != "auto" else (backends() or ["?"])[0])
        self._programs: OrderedDict[ProgramKey, Any] = OrderedDict()  # least recent first
        self._closed = False
        self._surfaces: list[Any] = []
        self._verify_planned: set[int] = set()             # verify buckets counted
        self._verify_surfaces: dict[str, Any] | None = None   # made at the first verify
        self.adapters = AdapterSet(arch)   # LoRA adapters, selected per call
        # (layer, grid) -> the LoRA input surfaces and the adapter written into them
        self._lora_io: dict[tuple[int, KvLora], tuple[list[Any], Adapter | None]] = {}
        # (adapter name, layer, grid) -> the adapter and its packed inputs, so selecting
        # an adapter run before is a copy into the surfaces
        self._packed: dict[tuple[str, int, KvLora], tuple[Adapter, list[np.ndarray]]] = {}
        self._cache_adapter: Adapter | None = None   # what the KV cache was filled with
        self._sigs: dict[int, tuple[Adapter, Signature]] = {}   # id(adapter) -> its signature
        self._planned: list[Signature] = [()]   # signatures whose programs fit the budget
        self._lora_counts: dict[tuple[str, int, Signature], int] = {}

        limit = a.max_positions
        decode = self.options.decode_buckets or arch.decode_buckets
        prefill = self.options.prefill_buckets or arch.prefill_buckets
        self._decode_buckets = sorted({min(t, limit) for t in decode})
        self._prefill_buckets = sorted({min(s, limit) for s in prefill})
        if any(b < 32 or b % 32 for b in self._decode_buckets + self._prefill_buckets):
            raise InvalidArgumentError(
                f"buckets must be multiples of 32 (ANE-C22/C24); got prefill "
                f"{self._prefill_buckets}, decode {self._decode_buckets} (the model's "
                f"context is {limit})")
        self.plan: ProgramPlan = plan_programs(
            arch, self._prefill_buckets, self._decode_buckets,
            self.options.program_weight_bytes, self.options.lora_rank_buckets)
        self._reuse = self.options.reuses_programs()
        self._model_digest = (store_keys.model_digest(arch, weights.fingerprint())
                              if self._reuse else "")
        self._tag = self._claim_tag(source)
        self._max_length = self._decode_buckets[-1]
        self._layout = lay = RowLayout.of(arch)
        self._specs = [arch.attention(i) for i in range(a.n_layers)]
        windows = sorted({s.window for s in self._specs})
        ropes = list(dict.fromkeys(s.rope for s in self._specs if s.rope is not None))
        in_shape = max((self._decode_surface(t, bool(ropes)) for t in self._decode_buckets),
                       key=_nbytes)
        out_shape = surface_shape([(lay.rows, lay.width), (1, a.kv_dim), (1, a.kv_dim)])
        self._width, self._rows, self._in_shape = in_shape[3], in_shape[1], in_shape
        self._widest = max(g.stop - g.start for g in self.plan.groups)

        def surface(shape: tuple[int, ...]) -> Any:
            s = Surface(_nbytes(shape))
            self._surfaces.append(s)
            return s

        grid = (self._rows, self._width)
        self._x_in = surface(in_shape)
        self._masks = {w: surface(in_shape) for w in windows}
        self._ropes = {r: surface(in_shape) for r in ropes}
        self._k = [surface(in_shape) for _ in range(a.n_layers)]
        self._v = [surface(in_shape) for _ in range(a.n_layers)]
        self._h_out = surface(out_shape)
        # the new key and value rows of each layer of the widest program
        self._k_out = [surface(out_shape) for _ in range(self._widest)]
        self._v_out = [surface(out_shape) for _ in range(self._widest)]
        chunks = [c for part in self.plan.heads for c in part.chunks]
        head_shape = surface_shape([(-(-rows // 32), 32) for _, rows in chunks])
        self._logit_surfaces = [surface(head_shape) for _ in chunks]
        self._head_outs: list[list[Any]] = []   # each head program's chunk surfaces
        at = 0
        for part in self.plan.heads:
            self._head_outs.append(self._logit_surfaces[at: at + len(part.chunks)])
            at += len(part.chunks)
        row = lay.items   # a folded [D] row: its first D items, then padding
        self._x_view = self._x_in.numpy(np.float16, (row,))[: a.dim]
        self._rope_views = {r: s.numpy(np.float16, grid)[:2, : a.head_dim]
                            for r, s in self._ropes.items()}
        self._rope_blocks: dict[Rope, tuple[int, np.ndarray]] = {}
        out_grid = (out_shape[1], out_shape[3])
        self._h_view = self._h_out.numpy(np.float16, (row,))[: a.dim]
        heads = (a.n_kv_heads, a.head_dim)
        self._k_out_views = [s.numpy(np.float16, out_grid)[0, : a.kv_dim].reshape(heads)
                             for s in self._k_out]
        self._v_out_views = [s.numpy(np.float16, out_grid)[0, : a.kv_dim].reshape(heads)
                             for s in self._v_out]
        self._logit_views = [s.numpy(np.float16, (head_shape[1] * head_shape[3],))[:rows]
                             for s, (_, rows) in zip(self._logit_surfaces, chunks, strict=True)]
        self._prefill_io: dict[int, tuple[list[Any], tuple[int, int]]] = {}
        self._pos = 0
        self._by_layer: set[tuple[int, Any]] = set()   # decode (bucket, adapters) too big
        self._steps = DecodeSequences(self._x_in, self._h_out, self._h_view.nbytes)
        # (bucket, adapter) of the decode sequence last run with every check: the next
        # token of the same pair runs it again (`_steps.rerun`) while its programs stay
        # loaded and no LoRA input has been rewritten since
        self._rerun_key: tuple[int, Adapter | None] | None = None
        self._token_evals = 0   # program evaluations of the last decode token
        self._cache = KVCache([s.numpy(np.float16) for s in self._k],
                              [s.numpy(np.float16) for s in self._v],
                              {w: s.numpy(np.float16, grid)[:, 0] for w, s in self._masks.items()},
                              a.n_kv_heads, a.head_dim, self._decode_buckets,
                              surfaces=[*self._k, *self._v])
        try:   # the base model's programs, counted at load
            self.compiles_needed = self._fit(self._planned)
        except PlanError:
            self.close()
            raise

    def _claim_tag(self, source: str) -> str:
        """The tag in this model's program names: from its digest when programs are
        reused (the same in every process), made unique among this process's open
        models (two live programs must not share a name, nor so an identifier)."""
        if self._model_digest:
            base = self._model_digest[:8]
        else:
            base = hashlib.sha256(f"{os.getpid()}:{next(_instances)}:{source}".encode()
                                  ).hexdigest()[:8]
        tag, n = base, 1
        while tag in _live_tags:
            tag, n = f"{base}{n}", n + 1
        _live_tags.add(tag)
        return tag

    def _decode_surface(self, cache: int, rope: bool) -> tuple[int, int, int, int]:
        """The surface shape a decode program at cache length `cache` binds."""
        a, lay = self.config, self._layout
        block = (lay.cache_rows(a.kv_dim, cache), lay.width)
        blocks = [(lay.rows, lay.width), block, block, (cache, 1)]
        if rope:
            blocks.append((2, a.head_dim))
        return surface_shape(blocks)

    # ---- protocol properties ----------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise ModelLoadError(f"{self._source or 'this model'}: no tokenizer was loaded "
                                 "(the folder has none Orion reads); pass token ids")
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Tokenizer | None) -> None:
        self._tokenizer = value

    def __repr__(self) -> str:
        return describe_model(self, self.arch.title, self.weights.parameter_count(),
                              self.arch.describe(),
                              self._closed)

    @property
    def position(self) -> int:
        """Tokens in the KV cache; 0 when it was filled with another adapter than the
        selected one (it holds nothing the selected adapter can continue)."""
        return self._pos if self._cache_adapter is self.adapters.selected else 0

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def prefill_buckets(self) -> tuple[int, ...]:
        return tuple(self._prefill_buckets)

    @property
    def backend(self) -> str:
        return self._backend

    # ---- LoRA adapters -----------------------------------------------------------------

    def load_adapter(self, path: str | Path, name: str = "default") -> None:
        """Loads a PEFT LoRA adapter folder beside the others (it is not selected)."""
        self._check_open()
        self.adapters.load(path, name)

    def set_adapter(self, name: str | None) -> None:
        """Selects a loaded adapter, or None for the base model: no compile, no reload
        for an adapter whose signature (modules, rank bucket) was run before. An adapter
        whose programs would not fit the compile budget is refused here (PlanError),
        before anything runs with it."""
        self._check_open()
        before = self.adapters.active
        self.adapters.select(name)
        sig = self._signature()
        if sig not in self._planned:
            try:
                self.compiles_needed = self._fit([*self._planned, sig], f"adapter {name!r}")
            except PlanError:
                self.adapters.select(before)
                raise
            self._planned.append(sig)

    @property
    def active_adapter(self) -> str | None:
        return self.adapters.active

    def _signature(self) -> Signature:
        """The selected adapter's program signature (its ranks in the plan's buckets)."""
        adapter = self.adapters.selected
        if adapter is None:
            return ()
        held = self._sigs.get(id(adapter))
        if held is None or held[0] is not adapter:
            held = self._sigs[id(adapter)] = (adapter, self.plan.lora_signature(adapter))
        return held[1]

    def _kv_lora(self, key: ProgramKey) -> KvLora | None:
        """The LoRA grid of a layer program: its inputs' width, and their rows as the
        most a LoRA input may take (so the uniform input size does not grow)."""
        if not key.lora:
            return None
        if key.kind == "decode":
            return KvLora(key.lora, self._width, self._rows)
        shape = self._prefill_shape(key.size)
        return KvLora(key.lora, shape[3], shape[1])

    def _batch_lora(self, key: ProgramKey) -> BatchLora | None:
        """A batch program's per-row LoRA grid (`orion.models.batch`): decode's grid a
        row, each row's block at most the rows of a slot's smallest cache, so the B
        blocks fit the batch's input surfaces whatever its buckets."""
        if not key.lora:
            return None
        capacity = self._layout.cache_rows(self.config.kv_dim, self._decode_buckets[0])
        return BatchLora(KvLora(key.lora, self._width, capacity), key.rows)

    def _lora_inputs_a_layer(self, kind: str, size: int, sig: Signature) -> int:
        """LoRA inputs of one layer of a program (the plan keeps a program's within
        its I/O bound)."""
        if not sig:
            return 0
        held = self._lora_counts.get((kind, size, sig))
        if held is None:
            kl = self._kv_lora(ProgramKey(kind, 0, size, sig))
            assert kl is not None
            held = self._lora_counts[kind, size, sig] = len(kl.chunk_rows(self.arch))
        return held

    def _prefill_keys(self, seq: int, sig: Signature) -> list[ProgramKey]:
        return self.plan.prefill_keys(seq, sig, self._lora_inputs_a_layer("prefill", seq, sig))

    def _decode_keys(self, cache: int, sig: Signature) -> list[ProgramKey]:
        return self.plan.decode_keys(cache, sig, self._lora_inputs_a_layer("decode", cache, sig))

    def _lora_inputs(self, key: ProgramKey) -> list[Any]:
        """The selected adapter's input surfaces for a layer program (each of its
        layers' in turn), written when the adapter differs from what they hold (a
        surface write: no compile, no reload)."""
        kl = self._kv_lora(key)
        if kl is None:
            return []
        return [s for layer in key.layers for s in self._layer_lora(key, kl, layer)]

    def _layer_lora(self, key: ProgramKey, kl: KvLora, layer: int) -> list[Any]:
        from orion.runtime import Surface

        adapter = self.adapters.selected
        assert adapter is not None
        surfaces, held = self._lora_io.get((layer, kl), ([], None))
        if held is not adapter:
            # every input of a program has one size (ANE-C18): that of its x
            shape = self._in_shape if key.kind == "decode" else self._prefill_shape(key.size)
            packed_key = (self.adapters.active or "", layer, kl)
            packed = self._packed.get(packed_key)
            if packed is None or packed[0] is not adapter:
                packed = (adapter, kl.pack(adapter, layer))
                self._packed[packed_key] = packed
            chunks = packed[1]
            while len(surfaces) < len(chunks):
                surfaces.append(Surface(_nbytes(shape)))
                self._surfaces.append(surfaces[-1])
            for surf, data in zip(surfaces, chunks, strict=False):
                surf.numpy(np.float16, (kl.capacity, kl.width))[: data.shape[0]] = data
            self._lora_io[layer, kl] = (surfaces, adapter)
            self._rerun_key = None   # a decode sequence may read these surfaces
        return surfaces

    # ---- programs ----------------------------------------------------------------------

    def _graph(self, key: ProgramKey) -> Graph:
        name = key.name(self.arch.model_type, self._tag)
        w = Weights(self.weights)
        if key.kind == "prefill":
            return P.prefill_graph(self.arch, w, key.layers, name, key.size,
                                   self._kv_lora(key))
        if key.kind == "decode":
            return P.decode_graph(self.arch, w, key.layers, name, key.size,
                                  self._kv_lora(key))
        if key.kind == "batch":
            return batch_graph(self.arch, w, key.layers, name, key.size, key.rows,
                               self._batch_lora(key))
        if key.kind in ("batch_head", "verify_head"):   # the heads of K rows
            return P.rows_head_graph(self.arch, w, name, self.plan.heads[key.layer].chunks,
                                     key.rows)
        if key.kind == "prompts":   # short prompts, several in one eval (orion.models.batch)
            return prompts_graph(self.arch, w, key.layers, name, key.size, key.rows)
        if key.kind == "verify":   # speculative decoding (orion.models.plan, verify)
            return P.verify_graph(self.arch, w, key.layers, name, key.size, key.rows)
        return P.head_graph(self.arch, w, name, self.plan.heads[key.layer].chunks)

    def _store_key(self, key: ProgramKey) -> str:
        """The program store's key of `key` (`orion.models.store_keys`)."""
        extra = repr(self._batch_lora(key)) if key.kind == "batch" else \
            repr(self._kv_lora(key)) if not key.kind.endswith("head") else \
            repr(self.plan.heads[key.layer].chunks)
        return store_keys.store_key(self._model_digest, key, self._tag, extra)

    def _have(self, key: ProgramKey) -> bool:
        """Whether `key` needs no compile: compiled already, or in the program store
        (on vane; opening one on ane compiles, so the count there is a floor)."""
        from orion.runtime import Program

        return key in self._programs or (self._reuse and Program.is_stored(self._store_key(key)))

    def _fit(self, sigs: list[Signature], what: str = "") -> int:
        """The compiles the programs of every signature in `sigs` (the base model's and
        those of the adapters selected so far) still need; PlanError when the process's
        compile budget cannot hold them (ANE-C31), said before anything runs."""
        from orion.runtime import compile_budget, compile_count

        left = compile_budget() - compile_count()
        where = what or (self._source or f"this {self.arch.model_type} model")
        return self.plan.fit(left, self._have, sigs, where, self._lora_inputs_a_layer)

    def program(self, key: ProgramKey) -> Any:
        """The compiled program for `key`: from the model, the program store, or
        compiled now."""
        self._check_open()
        hit = self._programs.get(key)
        if hit is not None:
            self.stats.cache_hits += 1
            return hit
        from orion.runtime import Program, compile_count

        t0 = time.perf_counter()
        spent = compile_count()
        store = self._store_key(key) if self._reuse else None
        prog = Program.open_stored(store, backend=self._backend_request,
                                   numerics=self.options.numerics) if store else None
        if prog is not None:
            self.stats.programs_reused += 1
        else:
            self.weights.close()   # pages the load's checks touched
            g = self._graph(key)
            self.weights.close()   # the graph holds its copies
            # the weight file goes from the graph's arrays straight to disk, and the
            # arrays are freed before the compile copies it: one copy in memory at a time
            with tempfile.TemporaryDirectory(prefix="orion-build-", dir=build_folder()) as folder:
                emitted = P.lower(g, Path(folder))
                del g
                gc.collect()   # the graph's weight arrays sit in reference cycles
                release_free_heap()
                prog = Program.compile(emitted.mil, emitted.weights,
                                       backend=self._backend_request,
                                       numerics=self.options.numerics, store_key=store)
            del emitted
        self._programs[key] = prog
        self._backend = prog.backend
        self.stats.programs_compiled += compile_count() - spent
        self.stats.compile_ms += 1e3 * (time.perf_counter() - t0)
        return prog

    def _build(self, keys: Sequence[ProgramKey],
               progress: Callable[[int, int], None] | None = None) -> None:
        """Builds the programs of `keys` not built yet (compiled, or opened from the
        store), all of them, with every program unloaded first: a build's weights then
        add to the model's smallest footprint, not its largest (docs/performance.md,
        change 38). Every program loads when it next runs, not here: loading them all
        back at once raised the peak again. Reloading costs little, as a program's
        weight files are those of the same layers' other programs, which the runtime
        holds once. `progress(done, total)` counts the distinct programs, those built
        already first."""
        unique = list(dict.fromkeys(keys))
        missing = [k for k in unique if k not in self._programs]
        if missing:
            for prog in self._programs.values():
                if prog.loaded:
                    prog.unload()
            release_free_heap()
        built = len(unique) - len(missing)
        if progress is not None and built:
            progress(built, len(unique))
        for n, key in enumerate(missing):
            self.program(key)
            if progress is not None:
                progress(built + n + 1, len(unique))

    def _loaded(self, key: ProgramKey) -> Any:
        """The program for `key`, loaded; the least recently used others are unloaded
        while the device refuses it for its limits (ANE-C34, ANE-C35)."""
        prog = self.program(key)
        self._programs.move_to_end(key)
        if prog.loaded:
            return prog
        while not prog.loaded:
            try:
                prog.load()
            except ConstraintError as exc:
                victims = [p for k, p in self._programs.items() if k != key and p.loaded]
                if exc.constraint_id not in ("ANE-C34", "ANE-C35") or not victims:
                    raise
                victims[0].unload()
        release_free_heap()   # a load's read buffers of weights another program shares
        return prog

    def _run(self, key: ProgramKey, inputs: list[Any], outputs: list[Any],
             then: ProgramKey | None = None, live: range | None = None) -> None:
        """Evaluates a program, loading it first (`_loaded`). `live`: of the key's
        rows, the ones whose values are read (`Program.set_live_columns`)."""
        prog = self._loaded(key)
        if live is not None:
            prog.set_live_columns(key.rows, len(live), live.start)
        prog.eval(inputs, outputs)
        following = self._programs.get(then) if then is not None else None
        if following is not None and following.loaded:
            following.prefetch()   # its weights start on their way through the host work

    def _check_open(self) -> None:
        if self._closed:
            raise StateError("the model is closed")

    # ---- cache ------------------------------------------------------------------------

    def reset(self) -> None:
        """Empties the KV cache; compiled programs stay."""
        self._check_open()
        self._cache.clear()
        self._pos = 0

    def truncate(self, n: int) -> None:
        """Keeps the first `n` cached tokens and forgets the rest, so a prompt that
        shares only a prefix with the cache reuses it (orion.models.prefix_cache)."""
        self._check_open()
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.position:
            raise InvalidArgumentError(f"cannot keep {n!r} of the {self.position} cached "
                                       "tokens")
        self._cache.truncate(n)
        self._pos = n

    def load_rows(self, rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Makes the cache hold these keys and values at positions [0, n) and moves
        the position to n: per layer (k, v) [KV, n, hd], as `_cache.layer_rows` gives
        them, saved from an earlier prompt's prefix with the base model selected
        (orion.models.batch's shared prefixes). What runs next sees the cache as it was
        when the rows were saved."""
        self._check_open()
        if len(rows) != self.config.n_layers:
            raise InvalidArgumentError(f"{len(rows)} layers of rows for a model of "
                                       f"{self.config.n_layers}")
        n = rows[0][0].shape[1]
        if not 0 < n < self._max_length:
            raise InvalidArgumentError(f"{n} rows do not fit the context "
                                       f"({self._max_length} tokens)")
        if self.adapters.selected is not None:
            raise StateError("saved rows are the base model's: select no adapter")
        self.reset()
        self._cache_adapter = None
        self._rerun_key = None
        self._cache.lay_out(self._cache.bucket_for(n))   # as a prefill of n leaves it
        kv = self.config.kv_dim
        for layer, (k, v) in enumerate(rows):
            self._cache.put(layer, 0, k.transpose(1, 0, 2).reshape(n, kv),
                            v.transpose(1, 0, 2).reshape(n, kv))
        self._cache.commit(0, n)
        self._pos = n

    def _embed(self, ids: Sequence[int], start: int) -> np.ndarray:
        ids_a = np.asarray(ids, dtype=np.int64)
        if ids_a.size and (ids_a.min() < 0 or ids_a.max() >= self.config.vocab_size):
            raise InvalidArgumentError(f"token ids must be in [0, {self.config.vocab_size})")
        return self.arch.embed(self.weights, ids_a, start)

    def _embed_at(self, ids: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        """fp32 [len(ids), D]: each token at its own position (a batch step's rows)."""
        ids_a = np.asarray(ids, dtype=np.int64)
        if ids_a.size and (ids_a.min() < 0 or ids_a.max() >= self.config.vocab_size):
            raise InvalidArgumentError(f"token ids must be in [0, {self.config.vocab_size})")
        return self.arch.embed_at(self.weights, ids_a, np.asarray(positions, dtype=np.int64))

    # ---- prefill ------------------------------------------------------------------------

    def _prefill_shape(self, seq: int) -> tuple[int, int, int, int]:
        """The one surface shape of a prefill program of bucket `seq`: x and h
        [D, S], each layer's k and v [KVD, S]."""
        a = self.config
        return max([surface_shape([(a.dim, seq)]),
                    surface_shape([(a.dim, seq), (a.kv_dim, seq), (a.kv_dim, seq)])],
                   key=_nbytes)

    def _prefill_surfaces(self, seq: int) -> tuple[list[Any], tuple[int, int]]:
        """x, h, then k, v of each layer of the widest program, of bucket `seq`."""
        if seq not in self._prefill_io:
            from orion.runtime import Surface

            shape = self._prefill_shape(seq)
            group = [Surface(_nbytes(shape)) for _ in range(2 + 2 * self._widest)]
            self._surfaces.extend(group)
            self._prefill_io[seq] = (group, (shape[1], shape[3]))
        return self._prefill_io[seq]

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Empties the cache, runs `ids` as one sequence and keeps its keys and values.
        Returns fp32 logits: [vocab] for the last position, or [len(ids), vocab] for
        every position when `all_logits`."""
        self._check_open()
        n = len(ids)
        split = prefill_beyond_buckets(self, ids, self._prefill_buckets[-1], all_logits)
        if split is not None:
            return split
        seq = smallest_bucket(self._prefill_buckets, n)
        x = self._embed(ids, 0)
        t0 = time.perf_counter()
        self.reset()
        self._cache_adapter = self.adapters.selected
        a = self.config
        surfaces, grid = self._prefill_surfaces(seq)
        cur, nxt, kv = surfaces[0], surfaces[1], surfaces[2:]
        keys = self._prefill_keys(seq, self._signature())
        self._build(([] if all_logits else self.plan.head_keys()) + keys)
        view = cur.numpy(np.float16, grid)
        view[: a.dim, :n] = x.T
        view[: a.dim, n:] = 0
        self._cache.lay_out(self._cache.bucket_for(n))   # the next decode step's layout
        for key in keys:
            outs = [nxt, *kv[: 2 * key.count]]
            self._run(key, [cur, *self._lora_inputs(key)], outs)
            for j, layer in enumerate(key.layers):
                self._cache.fill(layer, kv[2 * j].numpy(np.float16, grid)[: a.kv_dim, :n],
                                 kv[2 * j + 1].numpy(np.float16, grid)[: a.kv_dim, :n])
            cur, nxt = nxt, cur
        self._cache.commit(0, n)
        self._pos = n
        hidden = cur.numpy(np.float16, grid)[: a.dim, :n]
        if all_logits:
            logits = self._host_logits(hidden.astype(np.float32))
        else:
            self._h_view[...] = hidden[:, n - 1]
            logits = self._head_row()
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += n
        self.stats.prefill_ms += 1e3 * (time.perf_counter() - t0)
        return logits

    def _host_logits(self, hidden: np.ndarray) -> np.ndarray:
        """[n, vocab] fp32 for hidden [D, n]: the architecture's own final-norm block
        evaluated in fp32 on the host (orion.ir.reference), then the classifier, its
        table converted a slice at a time."""
        from orion.ir.reference import evaluate

        a = self.config
        g = Graph("final_norm_host")
        x = g.input("x", (1, a.dim, 1, hidden.shape[1]))
        g.output("y", self.arch.final_norm(Prefill(g, self.arch, -1, Weights(self.weights)),
                                           x))
        y = evaluate(g, {"x": hidden[None, :, None, :]})["y"]
        xfn = np.ascontiguousarray(y.reshape(a.dim, -1).T, np.float32)
        out = np.empty((xfn.shape[0], a.vocab_size), np.float32)
        for start, rows in P.head_chunks(a.vocab_size):
            part = slice(start, start + rows)
            out[:, part] = xfn @ self.weights.fp32(self.arch.classifier_name, part).T
        return out

    def _head_row(self) -> np.ndarray:
        for key, outs in zip(self.plan.head_keys(), self._head_outs, strict=True):
            self._run(key, [self._h_out], outs)
        return self._logits()

    def _logits(self) -> np.ndarray:
        """The head's logits as fp32, from its chunk surfaces."""
        # each chunk converted straight into its place (on vane's kernels: numpy's fp16
        # conversion is a scalar loop, ~0.3 ms for Qwen3's 151,936 logits)
        out = np.empty(sum(v.size for v in self._logit_views), np.float32)
        at = 0
        for view in self._logit_views:
            to_fp32(view, out=out[at: at + view.size])
            at += view.size
        return out

    # ---- decode -------------------------------------------------------------------------

    def decode(self, token: int) -> np.ndarray:
        """Runs one token at the next position against the cache: fp32 logits [vocab]."""
        self._check_open()
        pos = self._pos
        if pos >= self._max_length:
            raise InvalidArgumentError(f"the KV cache is full ({self._max_length} tokens)")
        if pos and self._cache_adapter is not self.adapters.selected:
            raise StateError(f"the KV cache was filled with another adapter than the "
                             f"selected {self.adapters.active!r}: prefill again")
        self._cache_adapter = self.adapters.selected
        x = self._embed([int(token)], pos)[0]
        t0 = time.perf_counter()
        cache = self._cache.bucket_for(pos)
        self._cache.lay_out(cache)
        self._x_view[...] = x
        for rope, view in self._rope_views.items():
            view[...] = self._rope_row(rope, pos)
        again = self._rerun_key
        if (again is not None and again[0] == cache and again[1] is self._cache_adapter
                and self._steps.rerun(self._cache, pos)):
            self.stats.cache_hits += self._token_evals
            logits = self._logits()
        else:
            logits = self._decode_checked(cache, pos)
        self.stats.decode_evals += self._token_evals
        self._cache.commit(pos, pos + 1)
        self._pos = pos + 1
        self.stats.decode_calls += 1
        self.stats.decode_ms += 1e3 * (time.perf_counter() - t0)
        return logits

    def _rope_row(self, rope: Rope, pos: int) -> np.ndarray:
        """The RoPE row of `pos`, from a block of positions computed at once: numpy
        working out one row a token took ~0.1 ms of a Qwen3 token's decode loop."""
        start = pos - pos % ROPE_BLOCK
        block = self._rope_blocks.get(rope)
        if block is None or block[0] != start:
            block = self._rope_blocks[rope] = (start, rope.rows(start, ROPE_BLOCK))
        return block[1][pos - start]

    def _step(self, key: ProgramKey) -> DecodeStep:
        """A decode program's surfaces in its declared order (`orion.models.programs`):
        x, each layer's k and v caches, the masks, the ropes, the LoRA inputs; out h and
        each layer's new k and v rows, which go into its caches."""
        layers = key.layers
        ins = [self._x_in]
        for i in layers:
            ins += [self._k[i], self._v[i]]
        ins += [self._masks[w] for w in P.group_windows(self.arch, layers)]
        ins += [self._ropes[r] for r in P.group_ropes(self.arch, layers)]
        ins += self._lora_inputs(key)
        outs = [self._h_out]
        appends = []
        for j, i in enumerate(layers):
            outs += [self._k_out[j], self._v_out[j]]
            appends += [(self._k_out[j], self._k[i]), (self._v_out[j], self._v[i])]
        return DecodeStep(None, ins, outs, appends)

    def _decode_checked(self, cache: int, pos: int) -> np.ndarray:
        """A decode step with every program looked up and loaded and every LoRA input
        checked: one C call when they all fit the device, else a program at a time."""
        self._rerun_key = None
        sig = self._signature()
        keys = self._decode_keys(cache, sig)
        self._token_evals = len(keys) + len(self.plan.heads)
        steps = [self._step(key) for key in keys]
        if (cache, sig) not in self._by_layer:
            self._build(keys + self.plan.head_keys())
            progs = [self._loaded(key) for key in keys]
            heads = [self._loaded(key) for key in self.plan.head_keys()]
            if self._all_loaded(progs + heads):   # all fit the device at once: one C call
                self._steps.run(self._cache, pos,
                                [replace(s, program=p) for s, p in zip(steps, progs, strict=True)],
                                [(h, [self._h_out], outs)
                                 for h, outs in zip(heads, self._head_outs, strict=True)])
                self._rerun_key = (cache, self._cache_adapter)
                return self._logits()
            # they never will: load each once a token from now on
            self._by_layer.add((cache, sig))
        return self._decode_by_program(keys, steps, pos)

    def _all_loaded(self, progs: list[Any]) -> bool:
        """Whether `progs` are loaded together: every model but one whose decode
        programs pass the device's limits (ANE-C34, ANE-C35) at once."""
        return all(p.loaded for p in progs)

    def _decode_by_program(self, keys: list[ProgramKey], steps: list[DecodeStep],
                           pos: int) -> np.ndarray:
        """Decode from Python, a program at a time: for a model whose decode programs
        do not fit the device at once, so each load may unload an earlier one's."""
        last = len(keys) - 1
        heads = self.plan.head_keys()
        for n, (key, step) in enumerate(zip(keys, steps, strict=True)):
            self._run(key, list(step.inputs), list(step.outputs),
                      then=keys[n + 1] if n < last else heads[0])
            for j, i in enumerate(key.layers):
                self._cache.append(i, pos, self._k_out_views[j], self._v_out_views[j])
            if n < last:
                self._x_view[...] = self._h_view
        return self._head_row()

    # ---- verify: K rows of one sequence in one eval (speculative decoding) -----------

    def plan_verify(self, rows: int) -> int:
        """Makes verify programs of `rows` rows (`orion.models.plan.VERIFY_ROWS`) count
        against the compile budget: the compiles they and the planned programs still
        need; PlanError, naming the numbers, when the process cannot hold them (before
        anything runs). StateError with a LoRA adapter selected: verify programs have
        no LoRA inputs."""
        from orion.models.plan import verify_programs, verify_rows
        from orion.runtime import compile_budget, compile_count

        self._check_open()
        if self.adapters.selected is not None:
            raise StateError(f"speculative decoding does not run with a LoRA adapter "
                             f"selected ({self.adapters.active!r}): its verify programs "
                             f"have no LoRA inputs; select None or generate without it")
        if rows != verify_rows(rows):
            raise InvalidArgumentError(f"{rows} is not a verify bucket")
        planned = self._verify_planned
        shape = max((self._verify_surface(t, rows) for t in self._decode_buckets), key=_nbytes)
        if shape[3] != self._in_shape[3] or shape[1] > self._in_shape[1]:
            raise PlanError(f"verify programs of {rows} rows need input surfaces of "
                            f"{shape}, past the decode surfaces {self._in_shape}: use "
                            f"fewer draft tokens")
        keys = {k for sig in self._planned for k in self.plan.programs(
            sig, self._lora_inputs_a_layer)}
        base = sum(1 for k in keys if not self._have(k))
        extra = [k for k in verify_programs(self.plan, rows) if not self._have(k)]
        left = compile_budget() - compile_count()
        if base + len(extra) > left:
            raise PlanError(
                f"speculative decoding needs {len(extra)} more compiles ({len(self.plan.groups)}"
                f" layer program(s) x {len(self._decode_buckets)} decode buckets + "
                f"{len(self.plan.heads)} head program(s), {rows} rows) beside the {base} "
                f"the model still needs, and this process has {left} of its compile budget "
                f"left (ANE-C31): generate without speculation, use fewer decode buckets, "
                f"or a fresh process (on vane, ORION_COMPILE_BUDGET)")
        planned.add(rows)
        return base + len(extra)

    def _verify_surface(self, cache: int, rows: int) -> tuple[int, int, int, int]:
        """The input surface shape a verify program at `cache`, `rows` binds."""
        a, lay = self.config, self._layout
        block = (lay.cache_rows(a.kv_dim, cache), lay.width)
        blocks = [(rows * lay.rows, lay.width), block, block, (cache, rows)]
        if self._ropes:
            blocks.append((2 * rows, a.head_dim))
        return surface_shape(blocks)

    def _verify_io(self) -> dict[str, Any]:
        """The verify programs' own surfaces (x, masks, ropes, outputs, logits; the
        caches are decode's), made at the first verify: the largest bucket's shapes."""
        io = self._verify_surfaces
        if io is not None:
            return io
        from orion.models.plan import VERIFY_ROWS
        from orion.runtime import Surface

        a = self.config

        def surface(shape: tuple[int, ...]) -> Any:
            s = Surface(_nbytes(shape))
            self._surfaces.append(s)
            return s

        most, lay = VERIFY_ROWS[-1], self._layout
        # h as K folded rows (the heads' x as it is), k_new and v_new a row a position
        out_shape = surface_shape([(most * lay.rows, lay.width), (most, a.kv_dim)])
        chunks = [c for part in self.plan.heads for c in part.chunks]
        head_shape = surface_shape([(most * -(-rows // 32), 32) for _, rows in chunks])
        logits = [surface(head_shape) for _ in chunks]
        heads, at = [], 0
        for part in self.plan.heads:
            heads.append(logits[at: at + len(part.chunks)])
            at += len(part.chunks)
        io = self._verify_surfaces = {
            "x": surface(self._in_shape),
            "masks": {w: surface(self._in_shape) for w in self._masks},
            "ropes": {r: surface(self._in_shape) for r in self._ropes},
            "h": surface(out_shape), "out_grid": (out_shape[1], out_shape[3]),
            "k": [surface(out_shape) for _ in range(self._widest)],
            "v": [surface(out_shape) for _ in range(self._widest)],
            "heads": heads, "chunks": chunks,
        }
        return io

    def verify(self, tokens: Sequence[int], last_only: bool = False) -> np.ndarray:
        """Runs `tokens` at positions p .. p+n-1 (p = `position`) against the cache in
        one eval a program (`orion.models.programs`, verify), writes their keys and
        values into the cache and moves the position to p + n; `truncate` keeps a
        prefix of them. fp32 logits [n, vocab]: row j those after tokens[:j+1], as n
        `decode` calls would give them. n pads to the smallest bucket `plan_verify`
        planned that holds it (else its own bucket, planned now; padding rows change
        nothing); p + n must fit the context (`max_length`). `last_only`: the logits
        [vocab] of the last row alone, by decode's head on its hidden state (a prompt's
        chunk needs no others: the verify head computes every row's, which on the
        Qwen3-0.6B shape is a third of a 32-row verify)."""
        from orion.models.plan import verify_head_keys

        def heads(rows: int) -> list[ProgramKey]:
            return self.plan.head_keys() if last_only else verify_head_keys(self.plan, rows)

        io, rows, n, t0 = self._verify_layers(tokens, heads)
        a = self.config
        if last_only:
            self._h_view[...] = self._last_hidden(io, rows, n)
            logits = self._head_row()
        else:
            logits = np.empty((n, a.vocab_size), np.float32)
            for key, outs in zip(heads(rows), io["heads"], strict=True):
                self._run(key, [io["h"]], outs)   # h is the heads' x as it is
            for surf, (start, count) in zip(sum(io["heads"], []), io["chunks"], strict=True):
                padded = -(-count // 32) * 32   # row j's logits: row j of [K, padded]
                logits[:, start: start + count] = to_fp32(
                    surf.numpy(np.float16, (rows, padded))[:n, :count])
        self.stats.decode_evals += len(self.plan.heads)
        self.stats.decode_ms += 1e3 * (time.perf_counter() - t0)
        return logits

    def verify_hidden(self, tokens: Sequence[int]) -> np.ndarray:
        """`verify(tokens, last_only=True)` without its head: the last row's hidden
        state (fp16 [dim], a copy), which decode's head, or a batch head's row, turns
        into those logits (`BatchDecoder` runs the heads of several prompts as one)."""
        io, rows, n, t0 = self._verify_layers(tokens, lambda rows: [])
        hidden = self._last_hidden(io, rows, n).copy()
        self.stats.decode_ms += 1e3 * (time.perf_counter() - t0)
        return hidden

    def _last_hidden(self, io: dict[str, Any], rows: int, n: int) -> np.ndarray:
        """A verify's hidden state after its n-th token (a view of h's row n - 1)."""
        return io["h"].numpy(np.float16, (rows, self._layout.items))[n - 1, : self.config.dim]

    def _verify_bucket(self, n: int) -> int:
        """The verify rows `n` tokens run in: the smallest bucket `plan_verify` planned
        that holds them (a step with fewer drafts than planned pads, and compiles
        nothing the plan did not count), else their own bucket, planned now."""
        from orion.models.plan import verify_rows

        rows = min((r for r in self._verify_planned if r >= n), default=0)
        if not rows:
            rows = verify_rows(n)
            self.plan_verify(rows)
        return rows

    def _verify_layers(self, tokens: Sequence[int], heads: Callable[[int], list[ProgramKey]]
                       ) -> tuple[dict[str, Any], int, int, float]:
        """`verify`'s layer programs (built with `heads(rows)`): the keys and values cached,
        the position moved. Returns the verify surfaces (h: every row's hidden state),
        the rows, the tokens and the start time."""
        from orion.models.plan import verify_keys

        self._check_open()
        n = len(tokens)
        pos = self._pos
        if n < 1:
            raise InvalidArgumentError("verify needs at least one token")
        if pos + n > self._max_length:
            raise InvalidArgumentError(f"{n} tokens at position {pos} pass the context "
                                       f"({self._max_length} tokens)")
        if pos and self._cache_adapter is not self.adapters.selected:
            raise StateError(f"the KV cache was filled with another adapter than the "
                             f"selected {self.adapters.active!r}: prefill again")
        rows = self._verify_bucket(n)
        x = self._embed([int(t) for t in tokens], pos)             # [n, D]
        t0 = time.perf_counter()
        a = self.config
        io = self._verify_io()
        cache = self._cache.bucket_for(pos + n - 1)
        self._cache.lay_out(cache)
        grid = (self._rows, self._width)
        fold = self._layout.items
        x_cols = io["x"].numpy(np.float16, (self._rows * self._width,))[: rows * fold] \
            .reshape(rows, fold)
        x_cols[...] = 0
        x_cols[:n, : a.dim] = x
        q = np.arange(cache)[:, None]
        j = np.arange(rows)[None, :]
        for w, surf in io["masks"].items():
            m = surf.numpy(np.float16, grid)[:cache, :rows]
            m[...] = self._masks_view(w)[:cache, None]             # decode's mask at p
            if w:   # row j at p + j sees p + j - w + 1 .. p + j
                m[...] = np.where(q < pos + j - w + 1, np.float16(MASK_VALUE), m)
        for rope, surf in io["ropes"].items():
            table = rope.rows(pos, rows)                           # [K, 2, hd]
            view = surf.numpy(np.float16, grid)
            view[:rows, : a.head_dim] = table[:, 0]
            view[rows: 2 * rows, : a.head_dim] = table[:, 1]
        out_grid = io["out_grid"]
        keys = verify_keys(self.plan, cache, rows)
        self._build(keys + heads(rows))
        for at, key in enumerate(keys):
            layers = key.layers
            ins = [io["x"]]
            for i in layers:
                ins += [self._k[i], self._v[i]]
            ins += [io["masks"][w] for w in P.group_windows(self.arch, layers)]
            ins += [io["ropes"][r] for r in P.group_ropes(self.arch, layers)]
            outs = [io["h"]]
            for jj in range(len(layers)):
                outs += [io["k"][jj], io["v"][jj]]
            # the padding rows' convs are not computed: a 5-token prompt in a verify
            # of 8 rows costs 5 columns (the rows after the last token see no others)
            self._run(key, ins, outs, live=range(n))
            for jj, i in enumerate(layers):
                self._cache.put(i, pos,
                                io["k"][jj].numpy(np.float16, out_grid)[:n, : a.kv_dim],
                                io["v"][jj].numpy(np.float16, out_grid)[:n, : a.kv_dim])
            if at < len(keys) - 1:
                x_cols[...] = io["h"].numpy(np.float16, (rows, fold))
        self._rerun_key = None   # the decode sequence's next run starts from its checks
        self._cache.commit(pos, pos + n)
        self._pos = pos + n
        self.stats.decode_evals += len(keys)
        return io, rows, n, t0

    def _masks_view(self, window: int) -> np.ndarray:
        """Decode's mask of `window` (one item a cache position)."""
        return self._masks[window].numpy(np.float16, (self._rows, self._width))[:, 0]

    # ---- life cycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Releases programs and surfaces. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._steps.release()
        for prog in self._programs.values():
            prog.release()
        self._programs.clear()
        self._lora_io.clear()
        self._packed.clear()
        self._logit_views = []
        self._cache.release()   # its views pin the surfaces
        self._rope_views = {}
        self._x_view = self._h_view = np.empty(0)
        self._k_out_views, self._v_out_views = [], []
        self._verify_surfaces = None
        for s in self._surfaces:
            s.release()
        self._surfaces = []
        self.weights.close()
        _live_tags.discard(self._tag)

    def __enter__(self) -> TransformerLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
