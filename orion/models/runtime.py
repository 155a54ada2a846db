"""The one runtime of every causal LM: an architecture's programs on a backend.

    model = orion.load("~/models/Qwen3-0.6B")[0]     # a TransformerLM
    logits = model.prefill(ids)
    logits = model.decode(int(logits.argmax()))

Every layer runs on the backend as a prefill program (the prompt, padded to a bucket)
or a decode program (one token against a KV cache kept in surfaces, holding the
n_kv_heads heads; `orion.models.programs` says what each program is), so a decode step
costs the same at any position of a bucket. The embedding lookup runs on the host from
the memory-mapped weights; the final norm and the classifier run as a device program
for the next-token row, and on the host in fp32 when every position's logits are asked
for. Programs are compiled on first use, one per (kind, layer, bucket, LoRA
signature), and kept for the life of the model; when the device cannot hold them all
(127 resident programs, ANE-C34; 4 GiB of loaded weights, ANE-C35) the least recently
used are unloaded and loaded again when needed.

A decode token is one C call (`orion.models.decode_sequence`) once its programs are
loaded. A selected LoRA adapter (`load_adapter`, `set_adapter`) is fed to the same
programs through inputs (`orion.models.adapters.KvLora`): selecting another adapter of
the same modules and ranks is a surface write.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import ConstraintError, InvalidArgumentError, ModelLoadError, StateError
from orion.ir.graph import Graph
from orion.ir.legalize import surface_shape
from orion.models import programs as P
from orion.models.adapters import Adapter, AdapterSet, KvLora
from orion.models.architecture import Architecture
from orion.models.base import ModelStats, describe_model, prefill_beyond_buckets, smallest_bucket
from orion.models.blocks import Prefill, RowLayout, Weights
from orion.models.decode_sequence import DecodeSequences
from orion.models.kv_cache import KVCache
from orion.models.programs import ProgramKey
from orion.models.rope import Rope
from orion.models.weights import WeightSource
from orion.runtime.fp16 import to_fp32
from orion.tokenizers.base import Tokenizer

_instances = itertools.count()
HEAD_ROW = ProgramKey("head", -1, 1)   # the classifier of one row (decode, prompt's last)
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
    """

    prefill_buckets: tuple[int, ...] | None = None
    decode_buckets: tuple[int, ...] | None = None
    numerics: str = "fp16"

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
        return replace(base, **overrides)


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
        self._tag = hashlib.sha256(
            f"{os.getpid()}:{next(_instances)}:{source}".encode()).hexdigest()[:8]
        self._closed = False
        self._surfaces: list[Any] = []
        self.adapters = AdapterSet(arch)   # LoRA adapters, selected per call
        # (layer, grid) -> the LoRA input surfaces and the adapter written into them
        self._lora_io: dict[tuple[int, KvLora], tuple[list[Any], Adapter | None]] = {}
        # (adapter name, layer, grid) -> the adapter and its packed inputs, so selecting
        # an adapter run before is a copy into the surfaces
        self._packed: dict[tuple[str, int, KvLora], tuple[Adapter, list[np.ndarray]]] = {}
        self._cache_adapter: Adapter | None = None   # what the KV cache was filled with

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
        self._max_length = self._decode_buckets[-1]
        self._layout = lay = RowLayout.of(arch)
        self._specs = [arch.attention(i) for i in range(a.n_layers)]
        windows = sorted({s.window for s in self._specs})
        ropes = list(dict.fromkeys(s.rope for s in self._specs if s.rope is not None))
        in_shape = max((self._decode_surface(t, bool(ropes)) for t in self._decode_buckets),
                       key=_nbytes)
        out_shape = surface_shape([(lay.rows, lay.width), (1, a.kv_dim), (1, a.kv_dim)])
        self._width, self._rows, self._in_shape = in_shape[3], in_shape[1], in_shape

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
        self._h_out, self._k_out, self._v_out = (surface(out_shape) for _ in range(3))
        chunks = P.head_chunks(a.vocab_size)
        head_shape = surface_shape([(-(-rows // 32), 32) for _, rows in chunks])
        self._logit_surfaces = [surface(head_shape) for _ in chunks]
        row = lay.rows * lay.width   # a folded [D] row: its first D items, then padding
        self._x_view = self._x_in.numpy(np.float16, (row,))[: a.dim]
        self._rope_views = {r: s.numpy(np.float16, grid)[:2, : a.head_dim]
                            for r, s in self._ropes.items()}
        self._rope_blocks: dict[Rope, tuple[int, np.ndarray]] = {}
        out_grid = (out_shape[1], out_shape[3])
        self._h_view = self._h_out.numpy(np.float16, (row,))[: a.dim]
        heads = (a.n_kv_heads, a.head_dim)
        self._k_out_view = self._k_out.numpy(np.float16, out_grid)[0, : a.kv_dim].reshape(heads)
        self._v_out_view = self._v_out.numpy(np.float16, out_grid)[0, : a.kv_dim].reshape(heads)
        self._logit_views = [s.numpy(np.float16, (head_shape[1] * head_shape[3],))[:rows]
                             for s, (_, rows) in zip(self._logit_surfaces, chunks, strict=True)]
        self._prefill_io: dict[int, tuple[list[Any], tuple[int, int]]] = {}
        self._pos = 0
        self._by_layer: set[tuple[int, Any]] = set()   # decode (bucket, adapters) too big
        self._steps = DecodeSequences(self._x_in, self._h_out, self._k_out, self._v_out,
                                      self._h_view.nbytes)
        # (bucket, adapter) of the decode sequence last run with every check: the next
        # token of the same pair runs it again (`_steps.rerun`) while its programs stay
        # loaded and no LoRA input has been rewritten since
        self._rerun_key: tuple[int, Adapter | None] | None = None
        self._cache = KVCache([s.numpy(np.float16) for s in self._k],
                              [s.numpy(np.float16) for s in self._v],
                              {w: s.numpy(np.float16, grid)[:, 0] for w, s in self._masks.items()},
                              a.n_kv_heads, a.head_dim, self._decode_buckets,
                              surfaces=[*self._k, *self._v])

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
        for an adapter whose signature (modules, rank) was run before."""
        self._check_open()
        self.adapters.select(name)

    @property
    def active_adapter(self) -> str | None:
        return self.adapters.active

    def _kv_lora(self, key: ProgramKey) -> KvLora | None:
        """The LoRA grid of a layer program: its inputs' width, and their rows as the
        most a LoRA input may take (so the uniform input size does not grow)."""
        if not key.lora:
            return None
        if key.kind == "decode":
            return KvLora(key.lora, self._width, self._rows)
        _, grid = self._prefill_surfaces(key.size)
        return KvLora(key.lora, grid[1], grid[0])

    def _lora_inputs(self, key: ProgramKey) -> list[Any]:
        """The selected adapter's input surfaces for a layer program, written when the
        adapter differs from what they hold (a surface write: no compile, no reload)."""
        kl = self._kv_lora(key)
        if kl is None:
            return []
        from orion.runtime import Surface

        adapter = self.adapters.selected
        assert adapter is not None
        surfaces, held = self._lora_io.get((key.layer, kl), ([], None))
        if held is not adapter:
            shape = (self._in_shape if key.kind == "decode"
                     else (1, kl.capacity, 1, kl.width))
            packed_key = (self.adapters.active or "", key.layer, kl)
            packed = self._packed.get(packed_key)
            if packed is None or packed[0] is not adapter:
                packed = (adapter, kl.pack(adapter, key.layer))
                self._packed[packed_key] = packed
            chunks = packed[1]
            while len(surfaces) < len(chunks):
                surfaces.append(Surface(_nbytes(shape)))
                self._surfaces.append(surfaces[-1])
            for surf, data in zip(surfaces, chunks, strict=False):
                surf.numpy(np.float16, (kl.capacity, kl.width))[: data.shape[0]] = data
            self._lora_io[key.layer, kl] = (surfaces, adapter)
            self._rerun_key = None   # a decode sequence may read these surfaces
        return surfaces

    # ---- programs ----------------------------------------------------------------------

    def _graph(self, key: ProgramKey) -> Graph:
        name = key.name(self.arch.model_type, self._tag)
        w = Weights(self.weights)
        if key.kind == "prefill":
            return P.prefill_graph(self.arch, w, key.layer, name, key.size, self._kv_lora(key))
        if key.kind == "decode":
            return P.decode_graph(self.arch, w, key.layer, name, key.size, self._kv_lora(key))
        return P.head_graph(self.arch, w, name)

    def program(self, key: ProgramKey) -> Any:
        """The compiled program for `key`: from the cache, or compiled now."""
        self._check_open()
        hit = self._programs.get(key)
        if hit is not None:
            self.stats.cache_hits += 1
            return hit
        from orion.runtime import Program

        t0 = time.perf_counter()
        self.weights.close()   # pages the load's checks touched
        g = self._graph(key)
        self.weights.close()   # the graph holds its copies
        emitted = P.lower(g)
        del g
        gc.collect()     # the graph's weight arrays sit in reference cycles: free them now
        prog = Program.compile(emitted.mil, emitted.weights, backend=self._backend_request,
                               numerics=self.options.numerics)
        del emitted      # its bytes are in the program's files now
        self._programs[key] = prog
        self._backend = prog.backend
        self.stats.programs_compiled += 1
        self.stats.compile_ms += 1e3 * (time.perf_counter() - t0)
        return prog

    def _loaded(self, key: ProgramKey) -> Any:
        """The program for `key`, loaded; the least recently used others are unloaded
        while the device refuses it for its limits (ANE-C34, ANE-C35)."""
        prog = self.program(key)
        self._programs.move_to_end(key)
        while not prog.loaded:
            try:
                prog.load()
            except ConstraintError as exc:
                victims = [p for k, p in self._programs.items() if k != key and p.loaded]
                if exc.constraint_id not in ("ANE-C34", "ANE-C35") or not victims:
                    raise
                victims[0].unload()
        return prog

    def _run(self, key: ProgramKey, inputs: list[Any], outputs: list[Any],
             then: ProgramKey | None = None) -> None:
        """Evaluates a program, loading it first (`_loaded`)."""
        prog = self._loaded(key)
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

    def _embed(self, ids: Sequence[int], start: int) -> np.ndarray:
        ids_a = np.asarray(ids, dtype=np.int64)
        if ids_a.size and (ids_a.min() < 0 or ids_a.max() >= self.config.vocab_size):
            raise InvalidArgumentError(f"token ids must be in [0, {self.config.vocab_size})")
        return self.arch.embed(self.weights, ids_a, start)

    # ---- prefill ------------------------------------------------------------------------

    def _prefill_surfaces(self, seq: int) -> tuple[list[Any], tuple[int, int]]:
        if seq not in self._prefill_io:
            from orion.runtime import Surface

            a = self.config
            shapes = [surface_shape([(a.dim, seq)]),
                      surface_shape([(a.dim, seq), (a.kv_dim, seq), (a.kv_dim, seq)])]
            shape = max(shapes, key=_nbytes)
            group = [Surface(_nbytes(shape)) for _ in range(4)]
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
        (cur, nxt, ks, vs), grid = self._prefill_surfaces(seq)
        if not all_logits and HEAD_ROW not in self._programs:   # the largest program
            self.program(HEAD_ROW)   # first: its build's temporaries meet no loaded layer
        view = cur.numpy(np.float16, grid)
        view[: a.dim, :n] = x.T
        view[: a.dim, n:] = 0
        sig = self.adapters.signature
        self._cache.lay_out(self._cache.bucket_for(n))   # the next decode step's layout
        for i in range(a.n_layers):
            key = ProgramKey("prefill", i, seq, sig)
            self._run(key, [cur, *self._lora_inputs(key)], [nxt, ks, vs])
            self._cache.fill(i, ks.numpy(np.float16, grid)[: a.kv_dim, :n],
                             vs.numpy(np.float16, grid)[: a.kv_dim, :n])
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
        self._run(HEAD_ROW, [self._h_out], self._logit_surfaces)
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
            self.stats.cache_hits += self.config.n_layers + 1
            logits = self._logits()
        else:
            logits = self._decode_checked(cache, pos)
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

    def _layer_inputs(self, i: int, key: ProgramKey) -> list[Any]:
        """A decode layer's inputs in their declared order: x, k, v, mask, rope, LoRA."""
        spec = self._specs[i]
        ins = [self._x_in, self._k[i], self._v[i], self._masks[spec.window]]
        if spec.rope is not None:
            ins.append(self._ropes[spec.rope])
        return ins + self._lora_inputs(key)

    def _decode_checked(self, cache: int, pos: int) -> np.ndarray:
        """A decode step with every program looked up and loaded and every LoRA input
        checked: one C call when they all fit the device, else a layer at a time."""
        self._rerun_key = None
        sig = self.adapters.signature
        keys = [ProgramKey("decode", i, cache, sig) for i in range(self.config.n_layers)]
        inputs = [self._layer_inputs(i, key) for i, key in enumerate(keys)]
        if (cache, sig) not in self._by_layer:
            layers = [self._loaded(key) for key in keys]
            head = self._loaded(HEAD_ROW)
            if self._all_loaded(layers):   # all fit the device at once: one C call
                self._steps.run(self._cache, pos, list(zip(layers, inputs, strict=True)),
                                (head, [self._h_out], self._logit_surfaces))
                self._rerun_key = (cache, self._cache_adapter)
                return self._logits()
            # they never will: load each once a token from now on
            self._by_layer.add((cache, sig))
        return self._decode_by_layer(keys, inputs, pos)

    def _all_loaded(self, progs: list[Any]) -> bool:
        """Whether `progs` are loaded together: every model but one whose decode
        programs pass the device's limits (ANE-C34, ANE-C35) at once."""
        return all(p.loaded for p in progs)

    def _decode_by_layer(self, keys: list[ProgramKey], inputs: list[list[Any]],
                         pos: int) -> np.ndarray:
        """Decode from Python, a layer at a time: for a model whose decode programs do
        not fit the device at once, so each load may unload an earlier layer's."""
        outs = [self._h_out, self._k_out, self._v_out]
        last = len(keys) - 1
        for i, key in enumerate(keys):
            self._run(key, inputs[i], outs, then=keys[i + 1] if i < last else HEAD_ROW)
            self._cache.append(i, pos, self._k_out_view, self._v_out_view)
            if i < last:
                self._x_view[...] = self._h_view
        return self._head_row()

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
        self._x_view = self._h_view = self._k_out_view = self._v_out_view = np.empty(0)
        for s in self._surfaces:
            s.release()
        self._surfaces = []
        self.weights.close()

    def __enter__(self) -> TransformerLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
