"""The Llama family (llama, mistral, qwen2, qwen3) as an Orion `CausalLM`, and its
loaders for `orion.load`.

    model = load_llama(Path("~/models/Qwen3-0.6B").expanduser())   # or orion.load(...)
    logits = model.prefill(ids)
    logits = model.decode(int(logits.argmax()))

Every layer runs on the backend as a prefill program (the prompt, padded to a bucket)
or a decode program (one token against a KV cache kept in surfaces, holding the
n_kv_heads heads; `orion.models.llama_kv_programs` says what each program is), so a
decode step costs the same at any position of a bucket. The embedding lookup runs on
the host from the memory-mapped weights; the final norm and the classifier run as a
device program for the next-token row, and on the host in fp32 when every position's
logits are asked for. Programs are compiled on first use, one per (kind, layer,
bucket, LoRA signature), and kept for the life of the model. A selected LoRA adapter
(`load_adapter`, `set_adapter`) is fed to the same KV-cache programs, compiled with
its LoRA inputs (`orion.lora.kv`): selecting another adapter of the same modules and
ranks is a surface write.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import ConstraintError, ModelLoadError
from orion.fp16 import to_fp32
from orion.ir.legalize import legalize_graph, legalize_program, surface_shape
from orion.ir.mil import emit
from orion.ir.program import program_from_graph
from orion.lora.adapter import Adapter
from orion.lora.kv import KvLora
from orion.lora.runtime import AdapterSet
from orion.models import llama_kv_programs as programs
from orion.models.base import ModelStats, describe_model, prefill_beyond_buckets, smallest_bucket
from orion.models.decode_sequence import DecodeSequences
from orion.models.kv_cache import KVCache
from orion.models.llama_config import LlamaConfig
from orion.models.llama_kv_programs import ProgramKey, RowLayout
from orion.models.llama_reference import rms_norm
from orion.models.llama_weights import (
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    LazyWeights,
    embedding_rows,
    open_hf,
)
from orion.tokenizers.base import Tokenizer

_instances = itertools.count()
HEAD_ROW = ProgramKey("head", -1, 1)   # the classifier of one row (decode, prompt's last)
ROPE_BLOCK = 64   # decode positions whose RoPE rows are worked out at once


@dataclass(frozen=True)
class LlamaOptions:
    """prefill_buckets: padded prompt lengths; a prompt runs at the smallest that holds
                     it (a longer one: the largest, then decode steps)
    decode_buckets:  KV cache lengths; a step at position p runs at the smallest > p.
                     The largest is the context the model can fill (capped at the
                     config's max_position_embeddings and Mistral's sliding_window)
    numerics:        "fp16" or "strict" (vane's device-exact arithmetic, ANE-C42)
    """

    prefill_buckets: tuple[int, ...] = (32, 128, 512)
    decode_buckets: tuple[int, ...] = (256, 1024, 2048)
    numerics: str = "fp16"


def _nbytes(shape: tuple[int, ...]) -> int:
    return 2 * int(np.prod(shape))


class LlamaLM:
    """A Llama-family model on a backend (see the module docstring)."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, np.ndarray],
                 tokenizer: Tokenizer | None, *, backend: str | None = None,
                 options: LlamaOptions | None = None, source: str = "") -> None:
        from orion.runtime import Surface, backends

        c = self.config = config
        self.weights = weights
        self._tokenizer = tokenizer
        self._source = source
        self.stats = ModelStats()
        self.options = options or LlamaOptions()
        self._backend_request = None if backend == "auto" else backend
        available = backends()
        env = os.environ.get("ORION_BACKEND")
        self._backend = backend if backend not in (None, "auto") else (
            env if env and env != "auto" else (available or ["?"])[0])
        self._programs: OrderedDict[ProgramKey, Any] = OrderedDict()  # least recent first
        self._tag = hashlib.sha256(
            f"{os.getpid()}:{next(_instances)}:{source}".encode()).hexdigest()[:8]
        self._closed = False
        self._surfaces: list[Any] = []
        self.adapters = AdapterSet(config)   # LoRA adapters, selected per call (orion.lora)
        # (layer, grid) -> the LoRA input surfaces and the adapter written into them
        self._lora_io: dict[tuple[int, KvLora], tuple[list[Any], Adapter | None]] = {}
        # (adapter name, layer, grid) -> the adapter and its packed inputs, so selecting
        # an adapter run before is a copy into the surfaces
        self._packed: dict[tuple[str, int, KvLora], tuple[Adapter, list[np.ndarray]]] = {}
        self._cache_adapter: Adapter | None = None   # what the KV cache was filled with

        limit = c.max_seq_len if not c.sliding_window else min(c.max_seq_len, c.sliding_window)
        self._decode_buckets = sorted({min(t, limit) for t in self.options.decode_buckets})
        self._prefill_buckets = sorted({min(s, limit) for s in self.options.prefill_buckets})
        if any(b < 32 or b % 32 for b in self._decode_buckets + self._prefill_buckets):
            raise ValueError("buckets must be multiples of 32 (ANE-C22/C24); the model's "
                             f"context limit is {limit}")
        self._max_length = self._decode_buckets[-1]
        self._limit_note = (f" (Mistral's sliding_window {c.sliding_window}: Orion does not "
                            "implement windowed attention, so the context stops there)"
                            if c.sliding_window and c.sliding_window <= self._max_length
                            else "")
        self._layout = lay = RowLayout.of(c)
        kvd = c.kv_dim
        in_shape = max((lay.surface(c, t) for t in self._decode_buckets), key=_nbytes)
        out_shape = surface_shape([(lay.rows, lay.width), (1, kvd), (1, kvd)])
        self._width = in_shape[3]
        self._rows = in_shape[1]
        self._in_shape = in_shape

        def surface(shape: tuple[int, ...]) -> Any:
            s = Surface(_nbytes(shape))
            self._surfaces.append(s)
            return s

        self._x_in, self._mask, self._rope = (surface(in_shape) for _ in range(3))
        self._k = [surface(in_shape) for _ in range(c.n_layers)]
        self._v = [surface(in_shape) for _ in range(c.n_layers)]
        self._h_out, self._k_out, self._v_out = (surface(out_shape) for _ in range(3))
        chunks = programs.head_chunks(c.vocab_size)
        head_shape = surface_shape([(-(-rows // 32), 32) for _, rows in chunks])
        self._logit_surfaces = [surface(head_shape) for _ in chunks]
        grid = (self._rows, self._width)
        row = lay.rows * lay.width   # a folded [D] row: its first D items, then padding
        self._x_view = self._x_in.numpy(np.float16, (row,))[: c.dim]
        self._rope_view = self._rope.numpy(np.float16, grid)[:2, : c.head_dim]
        out_grid = (out_shape[1], out_shape[3])
        self._h_view = self._h_out.numpy(np.float16, (row,))[: c.dim]
        heads = (c.n_kv_heads, c.head_dim)
        self._k_out_view = self._k_out.numpy(np.float16, out_grid)[0, :kvd].reshape(heads)
        self._v_out_view = self._v_out.numpy(np.float16, out_grid)[0, :kvd].reshape(heads)
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
        self._rope_block: tuple[int, np.ndarray] = (-1, np.empty(0))   # (first position, rows)
        self._cache = KVCache([s.numpy(np.float16) for s in self._k],
                              [s.numpy(np.float16) for s in self._v],
                              self._mask.numpy(np.float16, grid)[:, 0], c.n_kv_heads,
                              c.head_dim, self._decode_buckets,
                              surfaces=[*self._k, *self._v])

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
        c = self.config
        return describe_model(self, "Llama", self.weights,
                              f"{c.n_layers} layers, dim {c.dim}, {c.n_heads} heads, "
                              f"vocab {c.vocab_size}", self._closed)

    @property
    def position(self) -> int:
        """Tokens in the KV cache; 0 when it was filled with another adapter than the
        selected one (it holds nothing the selected adapter can continue)."""
        return self._pos if self._cache_adapter is self._active_adapter() else 0

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def backend(self) -> str:
        return self._backend

    # ---- LoRA adapters -----------------------------------------------------------------

    def load_adapter(self, path: str | Path, name: str = "default") -> None:
        """Loads a PEFT LoRA adapter folder beside the others (it is not selected)."""
        self.adapters.load(path, name)

    def set_adapter(self, name: str | None) -> None:
        """Selects a loaded adapter, or None for the base model: no compile, no reload
        for an adapter whose signature (modules, rank) was run before."""
        self.adapters.select(name)

    def _active_adapter(self) -> Adapter | None:
        name = self.adapters.active
        return None if name is None else self.adapters.adapters[name]

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

        adapter = self._active_adapter()
        assert adapter is not None
        surfaces, held = self._lora_io.get((key.layer, kl), ([], None))
        if held is not adapter:
            shape = (self._in_shape if key.kind == "decode"
                     else (1, kl.capacity, 1, kl.width))
            packed_key = (self.adapters.active or "", key.layer, kl)
            packed = self._packed.get(packed_key)
            if packed is None or packed[0] is not adapter:
                packed = (adapter, kl.pack(adapter, key.layer, self.config))
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

    def _graph(self, key: ProgramKey):  # noqa: ANN202 - an orion.ir Graph
        c, w, name = self.config, self.weights, key.name(self._tag)
        if key.kind == "prefill":
            return programs.prefill_layer_graph(c, w, key.layer, name, key.size,
                                                self._kv_lora(key))
        if key.kind == "decode":
            return programs.decode_layer_graph(c, w, key.layer, name, key.size,
                                               self._kv_lora(key))
        return programs.head_graph(c, w[FINAL_NORM], self._classifier_rows, name)

    def _classifier_rows(self, rows: slice) -> np.ndarray:
        """fp32 rows of the classifier (the embedding when tied)."""
        name = EMBED if self.config.tie_embeddings else LM_HEAD
        w = self.weights
        if isinstance(w, LazyWeights):
            return w.st.fp32(name, rows)
        return np.asarray(w[name][rows], np.float32)

    def _unmap_weights(self) -> None:
        """Unmaps the weight files: the pages read from them then leave the RSS (the next
        read maps them again, touching only what it reads)."""
        st = getattr(self.weights, "st", None)
        if st is not None:
            st.close()

    def program(self, key: ProgramKey) -> Any:
        """The compiled, loaded program for `key`: from the cache, or compiled now."""
        self._check_open()
        hit = self._programs.get(key)
        if hit is not None:
            self.stats.cache_hits += 1
            return hit
        from orion.runtime import Program

        t0 = time.perf_counter()
        self._unmap_weights()   # pages the load's checks touched
        g = self._graph(key)
        self._unmap_weights()   # the graph holds its copies
        emitted = emit(legalize_program(program_from_graph(legalize_graph(g), g.name)),
                       share_weights=True)
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
        """The program for `key`, loaded. A model whose programs do not all fit the
        device at once (127 resident programs, ANE-C34; 4 GiB of loaded weights,
        ANE-C35: Llama-3.2-1B's prefill and decode programs together pass it) unloads
        its least recently used programs to make room, and reloads them when needed."""
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
            raise ValueError("the model is closed")

    # ---- cache ------------------------------------------------------------------------

    def reset(self) -> None:
        self._check_open()
        self._cache.clear()
        self._pos = 0

    def _embed(self, ids: Sequence[int]) -> np.ndarray:
        ids_a = np.asarray(ids, dtype=np.int64)
        if ids_a.size and (ids_a.min() < 0 or ids_a.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        return embedding_rows(self.weights, ids_a)

    # ---- prefill ------------------------------------------------------------------------

    def _prefill_surfaces(self, seq: int) -> tuple[list[Any], tuple[int, int]]:
        if seq not in self._prefill_io:
            from orion.runtime import Surface

            c = self.config
            shapes = [surface_shape([(c.dim, seq)]),
                      surface_shape([(c.dim, seq), (c.kv_dim, seq), (c.kv_dim, seq)])]
            shape = max(shapes, key=_nbytes)
            group = [Surface(_nbytes(shape)) for _ in range(4)]
            self._surfaces.extend(group)
            self._prefill_io[seq] = (group, (shape[1], shape[3]))
        return self._prefill_io[seq]

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        self._check_open()
        n = len(ids)
        split = prefill_beyond_buckets(self, ids, self._prefill_buckets[-1], all_logits,
                                       self._limit_note)
        if split is not None:
            return split
        seq = smallest_bucket(self._prefill_buckets, n)
        x = self._embed(ids)
        t0 = time.perf_counter()
        self.reset()
        self._cache_adapter = self._active_adapter()
        c, d, kvd = self.config, self.config.dim, self.config.kv_dim
        (cur, nxt, ks, vs), grid = self._prefill_surfaces(seq)
        head_key = HEAD_ROW
        if not all_logits and head_key not in self._programs:   # the largest program
            self.program(head_key)   # first: its build's temporaries meet no loaded layer
        view = cur.numpy(np.float16, grid)
        view[:d, :n] = x.T
        view[:d, n:] = 0
        sig = self.adapters.signature
        self._cache.lay_out(self._cache.bucket_for(n))   # the next decode step's layout
        for i in range(c.n_layers):
            key = ProgramKey("prefill", i, seq, sig)
            self._run(key, [cur, *self._lora_inputs(key)], [nxt, ks, vs])
            self._cache.fill(i, ks.numpy(np.float16, grid)[:kvd, :n],
                             vs.numpy(np.float16, grid)[:kvd, :n])
            cur, nxt = nxt, cur
        self._cache.commit(0, n)
        self._pos = n
        hidden = cur.numpy(np.float16, grid)[:d, :n]
        if all_logits:
            logits = self._host_logits(hidden.T.astype(np.float32))
        else:
            self._h_view[...] = hidden[:, n - 1]
            logits = self._head_row()
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += n
        self.stats.prefill_ms += 1e3 * (time.perf_counter() - t0)
        return logits

    def _host_logits(self, hidden: np.ndarray) -> np.ndarray:
        """[n, vocab] fp32: final norm and classifier on the host, the table converted a
        slice at a time."""
        c = self.config
        xfn, _ = rms_norm(hidden, self.weights[FINAL_NORM], c.norm_eps)
        out = np.empty((hidden.shape[0], c.vocab_size), np.float32)
        for start, rows in programs.head_chunks(c.vocab_size):
            part = slice(start, start + rows)
            out[:, part] = xfn @ self._classifier_rows(part).T
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
        self._check_open()
        pos = self._pos
        if pos >= self._max_length:
            raise ValueError(f"the KV cache is full ({self._max_length} tokens)"
                             f"{self._limit_note}")
        if pos and self._cache_adapter is not self._active_adapter():
            raise ValueError(f"the KV cache was filled with another adapter than the "
                             f"selected {self.adapters.active!r}: prefill again")
        self._cache_adapter = self._active_adapter()
        x = self._embed([int(token)])[0]
        t0 = time.perf_counter()
        cache = self._cache.bucket_for(pos)
        self._cache.lay_out(cache)
        self._x_view[...] = x
        self._rope_view[...] = self._rope_row(pos)
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

    def _rope_row(self, pos: int) -> np.ndarray:
        """The RoPE row of `pos`, from a block of positions computed at once: numpy
        working out one row a token took ~0.1 ms of a Qwen3 token's decode loop."""
        start = pos - pos % ROPE_BLOCK
        if self._rope_block[0] != start:
            self._rope_block = (start, programs.rope_rows(self.config, start, ROPE_BLOCK))
        return self._rope_block[1][pos - start]

    def _decode_checked(self, cache: int, pos: int) -> np.ndarray:
        """A decode step with every program looked up and loaded and every LoRA input
        checked: one C call when they all fit the device, else a layer at a time."""
        self._rerun_key = None
        sig = self.adapters.signature
        keys = [ProgramKey("decode", i, cache, sig) for i in range(self.config.n_layers)]
        inputs = [[self._x_in, self._k[i], self._v[i], self._mask, self._rope,
                   *self._lora_inputs(key)] for i, key in enumerate(keys)]
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
        self._cache = None   # type: ignore[assignment] - its views pin the surfaces
        self._x_view = self._rope_view = None
        self._h_view = self._k_out_view = self._v_out_view = None
        for s in self._surfaces:
            s.release()
        self._surfaces = []
        st = getattr(self.weights, "st", None)
        if st is not None:
            st.close()

    def __enter__(self) -> LlamaLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _options(options: LlamaOptions | None, overrides: dict[str, Any]) -> LlamaOptions | None:
    if not overrides:
        return options
    unknown = set(overrides) - set(LlamaOptions.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown Llama options: {', '.join(sorted(unknown))}")
    return LlamaOptions(**{**(options or LlamaOptions()).__dict__, **overrides})


def _tokenizer_for(folder: Path, vocab_size: int) -> Tokenizer:
    from orion.tokenizers import load_tokenizer

    tok = load_tokenizer(folder)
    if tok is None:
        raise ModelLoadError(f"{folder}: no tokenizer.json or tokenizer.model")
    if tok.vocab_size > vocab_size:
        raise ModelLoadError(f"{folder}: the tokenizer has {tok.vocab_size} tokens, the "
                             f"model {vocab_size}")
    return tok


def _with_adapter(model: LlamaLM, adapter_path: str | Path | None) -> LlamaLM:
    """`adapter_path` loaded as "default" and selected (a bad one closes the model)."""
    if adapter_path is not None:
        try:
            model.load_adapter(adapter_path)
            model.set_adapter("default")
        except BaseException:
            model.close()
            raise
    return model


def load_llama(path: Path, *, backend: str | None = None, tokenizer: Tokenizer | None = None,
               options: LlamaOptions | None = None, adapter_path: str | Path | None = None,
               **overrides: Any) -> LlamaLM:
    """A Hugging Face Llama-family folder (config.json, *.safetensors, a tokenizer);
    `adapter_path`: a PEFT LoRA adapter folder, loaded as "default" and selected.

    Everything is checked before a surface is allocated (`open_hf`). A folder without
    a tokenizer Orion reads still loads (its `tokenizer` raises when used)."""
    path = Path(path)
    cfg, weights = open_hf(path)
    tok = tokenizer
    if tok is None and any((path / name).exists()
                           for name in ("tokenizer.json", "tokenizer.model")):
        tok = _tokenizer_for(path, cfg.vocab_size)
    return _with_adapter(LlamaLM(cfg, weights, tok, backend=backend,
                                 options=_options(options, overrides), source=str(path)),
                         adapter_path)


def load_llama2c(path: Path, *, backend: str | None = None, tokenizer: Tokenizer | None = None,
                 options: LlamaOptions | None = None, adapter_path: str | Path | None = None,
                 **overrides: Any) -> LlamaLM:
    """A llama2.c .bin checkpoint; the tokenizer is tokenizer.model beside it (Meta's
    Llama-2 vocabulary for the TinyStories models)."""
    from orion.formats.llama2c import read_llama2c

    cfg, weights = read_llama2c(path)
    return _with_adapter(LlamaLM(cfg, weights,
                                 tokenizer or _tokenizer_for(Path(path).parent, cfg.vocab_size),
                                 backend=backend, options=_options(options, overrides),
                                 source=str(path)), adapter_path)


def default_model_path() -> Path:
    """The model the package ships (orion/assets/shakespeare-llama): a small Llama
    trained on Shakespeare with Orion (docs/training.md has the command)."""
    return Path(__file__).resolve().parents[1] / "assets" / "shakespeare-llama"
