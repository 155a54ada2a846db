"""GPT-2 on the backend: prefill, decode with a KV cache in surfaces, final norm + head.

    model = load_gpt2(Path("my-gpt2"))          # or orion.load(...)
    logits = model.prefill(model.tokenizer.encode("Hello"))
    logits = model.decode(int(logits.argmax()))

The embedding lookup runs on the host (numpy, the rows it needs read from the
memory-mapped weights); every layer and the LM head run as programs on the backend
(`orion.models.gpt2_programs` says what each program is), their weights read in fp16
as each program is built: the host keeps no copy of the model.
Programs are compiled on first use, one per (kind, layer, bucket), and kept for the
life of the model: a generation never compiles twice for the same shape, and
`stats` counts compiles and cache hits.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.fp16 import to_fp32
from orion.heap import release_free_heap
from orion.ir.legalize import surface_shape
from orion.ir.mil import EmittedProgram
from orion.models import gpt2_programs as programs
from orion.models.base import ModelStats, describe_model, prefill_beyond_buckets, smallest_bucket
from orion.models.decode_sequence import DecodeSequences
from orion.models.gpt2_programs import ProgramKey
from orion.models.gpt2_weights import GPT2Config, GPT2Weights, load_gpt2_weights
from orion.models.kv_cache import KVCache
from orion.tokenizers.base import Tokenizer
from orion.tokenizers.gpt2 import GPT2Tokenizer

_instances = itertools.count()


@dataclass(frozen=True)
class GPT2Options:
    """prefill_buckets: padded prompt lengths; a prompt runs at the smallest that holds it
    decode_buckets:  KV cache lengths; a step at position p runs at the smallest > p.
                     The largest is the context the model can fill (capped at n_positions)
    numerics:        "fp16" or "strict" (vane's device-exact arithmetic, ANE-C42)
    """

    prefill_buckets: tuple[int, ...] = (32, 128, 512, 1024)
    decode_buckets: tuple[int, ...] = (256, 1024)
    numerics: str = "fp16"


@dataclass
class _Compiled:
    program: Any                 # orion.runtime.Program
    emitted: EmittedProgram


def _surface_bytes(blocks: list[tuple[int, int]]) -> int:
    return 2 * int(np.prod(surface_shape(blocks)))


class GPT2:
    """A GPT-2 whose layers run on a backend (see the module docstring)."""

    def __init__(self, config: GPT2Config, weights: GPT2Weights, tokenizer: Tokenizer, *,
                 backend: str | None = None, options: GPT2Options | None = None,
                 source: str = "") -> None:
        from orion.runtime import Surface, backends

        self.config = config
        self.tokenizer = tokenizer
        self.stats = ModelStats()
        self.options = options or GPT2Options()
        self._weights = weights
        self._backend_request = backend
        self._programs: dict[ProgramKey, _Compiled] = {}
        self._tag = hashlib.sha256(
            f"{os.getpid()}:{next(_instances)}:{source}".encode()).hexdigest()[:8]
        self._closed = False
        available = backends()
        self._backend = backend if backend not in (None, "auto") else (available or ["?"])[0]

        c, d = config, config.n_embd
        self._decode_buckets = sorted({min(t, c.n_positions) for t in self.options.decode_buckets})
        self._prefill_buckets = sorted({min(s, c.n_positions)
                                        for s in self.options.prefill_buckets})
        if any(b < 32 for b in self._decode_buckets + self._prefill_buckets):
            raise InvalidArgumentError("buckets must be at least 32 (ANE-C24: width >= 32)")
        if d % 32:
            raise ModelLoadError(f"n_embd {d} is not a multiple of 32 (ANE-C22: the "
                                 "cache rows are the device width)")
        t_max = self._decode_buckets[-1]
        # decode: one allocation size for every input (ANE-C18), the largest bucket's
        in_bytes = max(_surface_bytes([(1, d), (t, d), (t, d), (t, 1)])
                       for t in self._decode_buckets)
        out_bytes = _surface_bytes([(1, d)] * 3)
        self._rows = in_bytes // (2 * d)          # cache rows the surfaces hold
        self._x_in = Surface(in_bytes)
        self._k = [Surface(in_bytes) for _ in range(c.n_layer)]
        self._v = [Surface(in_bytes) for _ in range(c.n_layer)]
        self._mask = Surface(in_bytes)
        self._h_out, self._k_out, self._v_out = (Surface(out_bytes) for _ in range(3))
        v_row = programs.row_vocab(c.vocab_size)
        self._logits_row = Surface(_surface_bytes([(v_row // 32, 32)]))
        hd = d // c.n_head
        self._x_view = self._x_in.numpy(np.float16, (d,))
        self._h_view = self._h_out.numpy(np.float16, (d,))
        self._logits_view = self._logits_row.numpy(np.float16, (c.vocab_size,))
        self._prefill_surfaces: dict[int, list[Any]] = {}
        self._wide_logits: dict[int, Any] = {}
        self._steps = DecodeSequences(self._x_in, self._h_out, self._k_out, self._v_out,
                                      self._h_view.nbytes)
        self._max_length = min(t_max, c.n_positions)
        self._pos = 0
        self._cache = KVCache([s.numpy(np.float16) for s in self._k],
                              [s.numpy(np.float16) for s in self._v],
                              self._mask.numpy(np.float16, (self._rows, d))[:, 0], c.n_head,
                              hd, self._decode_buckets,
                              surfaces=[*self._k, *self._v])

    def __repr__(self) -> str:
        c = self.config
        return describe_model(self, "GPT-2", self._weights,
                              f"{c.n_layer} layers, dim {c.n_embd}, {c.n_head} heads, "
                              f"vocab {c.vocab_size}", self._closed)

    # ---- protocol properties ----------------------------------------------------------

    @property
    def position(self) -> int:
        return self._pos

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def backend(self) -> str:
        return self._backend

    # ---- programs ----------------------------------------------------------------------

    def _graph(self, key: ProgramKey):  # noqa: ANN202 - an orion.ir Graph
        c, w, name = self.config, self._weights, key.name(self._tag)
        if key.kind == "prefill":
            return programs.prefill_layer_graph(c, w.layer(key.layer), name, key.size)
        if key.kind == "decode":
            return programs.decode_layer_graph(c, w.layer(key.layer), name, key.size)
        return programs.head_graph(c, *w.final_norm(), w.head_rows, name, key.size)

    def program(self, key: ProgramKey) -> _Compiled:
        """The compiled, loaded program for `key`: from the cache, or compiled now."""
        return self._ready([key])[0]

    def _ready(self, keys: Sequence[ProgramKey]) -> list[_Compiled]:
        """The programs for `keys`, loaded; those not compiled yet are compiled first,
        all of them before any is loaded, and with every other program unloaded. A
        build holds a layer's weights about twice over for a moment; this way that
        adds to the model's smallest footprint, never to its largest (GPT-2 124M:
        ~30 MiB on its 300 MiB). Reloading costs little: a program's weight files are
        those of the same layer's other programs, which the runtime holds once."""
        self._check_open()
        missing = [k for k in dict.fromkeys(keys) if k not in self._programs]
        self.stats.cache_hits += len(keys) - len(missing)
        if missing:
            for cp in self._programs.values():
                if cp.program.loaded:
                    cp.program.unload()
            release_free_heap()
            for key in missing:
                self._programs[key] = self._compile(key)
        out = [self._programs[k] for k in keys]
        for cp in out:
            if not cp.program.loaded:
                cp.program.load()
        return out

    def _compile(self, key: ProgramKey) -> _Compiled:
        from orion.runtime import Program

        t0 = time.perf_counter()
        graph = self._graph(key)
        emitted = programs.lower(graph)
        del graph
        gc.collect()   # the graph's weight arrays sit in reference cycles: free them now
        prog = Program.compile(emitted.mil, emitted.weights, backend=self._backend_request,
                               numerics=self.options.numerics)
        # the weights now live in the program's files: keeping their bytes here too
        # would hold a second copy of the model for as long as it is loaded
        emitted = replace(emitted, weights={})
        release_free_heap()   # the build's temporaries, before the next build
        self._backend = prog.backend
        self.stats.programs_compiled += 1
        self.stats.compile_ms += 1e3 * (time.perf_counter() - t0)
        return _Compiled(prog, emitted)

    # ---- cache ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the model is closed")

    def reset(self) -> None:
        self._check_open()
        self._cache.clear()
        self._pos = 0

    def truncate(self, n: int) -> None:
        """Keeps the first `n` cached tokens and forgets the rest, so a prompt that
        shares only a prefix with the cache reuses it (orion.models.prefix_cache)."""
        self._check_open()
        if not 0 <= n <= self._pos:
            raise ValueError(f"cannot keep {n} of the {self._pos} cached tokens")
        self._cache.truncate(n)
        self._pos = n

    def _embed(self, ids: Sequence[int], start: int) -> np.ndarray:
        ids_a = np.asarray(ids, dtype=np.int64)
        if ids_a.size and (ids_a.min() < 0 or ids_a.max() >= self.config.vocab_size):
            raise InvalidArgumentError(f"token ids must be in [0, {self.config.vocab_size})")
        return self._weights.embed(ids_a, start)

    # ---- prefill ------------------------------------------------------------------------

    def _prefill_io(self, seq: int) -> list[Any]:
        from orion.runtime import Surface

        if seq not in self._prefill_surfaces:
            nbytes = _surface_bytes([(self.config.n_embd, seq)])
            self._prefill_surfaces[seq] = [Surface(nbytes) for _ in range(4)]
        return self._prefill_surfaces[seq]

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        self._check_open()
        n = len(ids)
        split = prefill_beyond_buckets(self, ids, self._prefill_buckets[-1], all_logits)
        if split is not None:
            return split
        seq = smallest_bucket(self._prefill_buckets, n)
        t0 = time.perf_counter()
        self.reset()
        c, d = self.config, self.config.n_embd
        head_key = ProgramKey("head", -1, seq if all_logits else 1)
        layers = [ProgramKey("prefill", i, seq) for i in range(c.n_layer)]
        # a head not built yet is built with the layers (not alone after them, which
        # would unload them again); a built one counts its cache hit where it runs
        compiled = self._ready(([] if head_key in self._programs else [head_key]) + layers)
        compiled = compiled[-c.n_layer:]
        cur, nxt, ks, vs = self._prefill_io(seq)
        view = cur.numpy(np.float16, (d, seq))
        view[:, :n] = self._embed(ids, 0).T
        view[:, n:] = 0
        self._cache.lay_out(self._cache.bucket_for(n))   # the next decode step's layout
        for i, cp in enumerate(compiled):
            cp.program.eval([cur], [nxt, ks, vs])
            self._cache.fill(i, ks.numpy(np.float16, (d, seq))[:, :n],
                             vs.numpy(np.float16, (d, seq))[:, :n])
            cur, nxt = nxt, cur
        self._cache.commit(0, n)
        self._pos = n
        hidden = cur.numpy(np.float16, (d, seq))
        if all_logits:
            head = self.program(ProgramKey("head", -1, seq))
            if seq not in self._wide_logits:
                from orion.runtime import Surface

                self._wide_logits[seq] = Surface(_surface_bytes([(c.vocab_size, seq)]))
            out = self._wide_logits[seq]
            head.program.eval([cur], [out])
            logits = out.numpy(np.float16, (c.vocab_size, seq))[:, :n].T.astype(np.float32)
        else:
            self._h_view[...] = hidden[:, n - 1]
            logits = self._head_row()
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += n
        self.stats.prefill_ms += 1e3 * (time.perf_counter() - t0)
        return logits

    def _head_row(self) -> np.ndarray:
        head = self.program(ProgramKey("head", -1, 1))
        head.program.eval([self._h_out], [self._logits_row])
        return self._logits()

    def _logits(self) -> np.ndarray:
        """The row head's logits as fp32 (on vane's kernels: numpy's is a scalar loop)."""
        return to_fp32(self._logits_view)

    # ---- decode -------------------------------------------------------------------------

    def decode(self, token: int) -> np.ndarray:
        self._check_open()
        pos = self._pos
        if pos >= self._max_length:
            raise InvalidArgumentError(f"the KV cache is full ({self._max_length} tokens)")
        t0 = time.perf_counter()
        cache = self._cache.bucket_for(pos)
        x = self._embed([int(token)], pos)[0]
        self._cache.lay_out(cache)
        self._x_view[...] = x
        # a bucket's programs and surfaces never change: while they all stay loaded, the
        # sequence built at its first token runs again without the checks below
        if self._steps.rerun(self._cache, pos):
            self.stats.cache_hits += self.config.n_layer + 1
        else:
            # the head with the layers: a head built alone after them would unload them
            *compiled, head = self._ready([ProgramKey("decode", i, cache)
                                           for i in range(self.config.n_layer)]
                                          + [ProgramKey("head", -1, 1)])
            self._steps.run(self._cache, pos,
                            [(cp.program, [self._x_in, self._k[i], self._v[i], self._mask])
                             for i, cp in enumerate(compiled)],
                            (head.program, [self._h_out], [self._logits_row]))
        logits = self._logits()
        self._cache.commit(pos, pos + 1)
        self._pos = pos + 1
        self.stats.decode_calls += 1
        self.stats.decode_ms += 1e3 * (time.perf_counter() - t0)
        return logits

    # ---- life cycle ---------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._steps.release()
        for cp in self._programs.values():
            cp.program.release()
        self._programs.clear()
        self._cache = None   # type: ignore[assignment] - its views pin the surfaces
        self._x_view = self._h_view = None
        self._logits_view = None
        surfaces = [self._x_in, self._mask, self._h_out, self._k_out,
                    self._v_out, self._logits_row, *self._k, *self._v,
                    *self._wide_logits.values()]
        for group in self._prefill_surfaces.values():
            surfaces.extend(group)
        for s in surfaces:
            s.release()
        st = getattr(self._weights, "st", None)
        if st is not None:      # the embedding lookup's open descriptors
            st.close()

    def __enter__(self) -> GPT2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _tokenizer_for(folder: Path) -> Tokenizer:
    """The folder's tokenizer.json (Hugging Face tokenizers) when it has one, else
    GPT-2's BPE on tiktoken: its vocab/merges files, or GPT-2's own shipped ranks."""
    from orion.tokenizers import load_tokenizer

    if (folder / "tokenizer.json").exists():
        tok = load_tokenizer(folder)
        if tok is not None:
            return tok
    return GPT2Tokenizer.for_model(folder)


def load_gpt2(path: Path, *, backend: str | None = None, tokenizer: Tokenizer | None = None,
              options: GPT2Options | None = None, **overrides: Any) -> GPT2:
    """A GPT-2 from a Hugging Face model folder (config.json + model.safetensors).

    The folder's own tokenizer files are used when it has them, else GPT-2's. Keyword
    overrides set `GPT2Options` fields (prefill_buckets=..., decode_buckets=...).
    """
    path = Path(path)
    if overrides:
        base = options or GPT2Options()
        unknown = set(overrides) - set(GPT2Options.__dataclass_fields__)
        if unknown:
            raise InvalidArgumentError(f"unknown GPT-2 options: {', '.join(sorted(unknown))}")
        options = GPT2Options(**{**base.__dict__, **overrides})
    config, weights = load_gpt2_weights(path)
    tok = tokenizer or _tokenizer_for(path)
    if tok.vocab_size > config.vocab_size:
        raise ModelLoadError(f"{path}: the tokenizer has {tok.vocab_size} tokens, the model "
                             f"{config.vocab_size}")
    return GPT2(config, weights, tok, backend=backend, options=options, source=str(path))
