"""Batched decode: up to B sequences ("slots") of one model advance a token each per
eval of the batch programs (`orion.models.batch_programs`), so the weights are read
once for B tokens.

    batch = BatchDecoder(model, slots=8)          # KV memory: slots x context positions
    slot = batch.acquire()                        # None when every slot is taken
    logits = batch.start(slot, prompt_ids)        # the prompt's last-position logits
    out = batch.step({slot: token, other: tok2})  # slot -> fp32 logits [vocab]
    batch.release(slot)

A prompt runs through the model's own prefill (its single-sequence cache is the
staging area), from position 0 every time, and its keys and values are copied into
the slot: what a slot holds never depends on what another request left behind. A
long prompt can go in chunks, with steps of the other slots between them:

    run = batch.begin(slot, prompt_ids, chunk=128)   # the first 128 by prefill,
    while (logits := batch.advance(run)) is None:    # then 32 a call by the model's
        batch.step(...)                              # verify (K rows in one eval)

With `advance(run, defer_head=True)`, a prompt whose last piece is a verify leaves
its last hidden state in its slot's row of the batch head, and `heads()` then gives
the logits of every such prompt from one eval of the batch head (the bits the decode
head gives each), so that prompts going in back to back read the head's weights once.

The chunks are cut at the same places whatever else runs (the first `chunk` tokens,
then every 32), so a prompt's logits do not depend on the other requests either; a
prompt of at most `chunk` tokens is one prefill, the bits `start` gives it. After
`plan_short_prompts`, a prompt of at most 16 tokens goes in as one verify of 8 or 16
rows from position 0 instead (the model's verify against its emptied cache), for
every request alike. After `plan_packs`, `pack({slot: ids, ...})` puts several prompts
of at most 8 tokens into their slots in one eval, each in a group of rows of its own,
their logits from `heads`.
Each row of a step is its slot's decode step alone (its own position, cache, mask and
RoPE row); no row reads another's keys, so a sequence's logits do not depend on which
other slots are live. The slots' caches share one layout, that of the smallest decode
bucket past the furthest slot's position (`KVCache`'s layout, with the slot as the
leading axis); moving to a larger bucket moves every slot's rows once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from orion.errors import InvalidArgumentError, PlanError, StateError
from orion.ir.composites import MASK_VALUE
from orion.ir.legalize import surface_shape
from orion.models.adapters import Adapter, Signature
from orion.models.base import smallest_bucket
from orion.models.plan import ProgramKey
from orion.models.programs import group_ropes
from orion.models.shared_prefixes import SharedPrefixes, chunk_cuts
from orion.runtime.fp16 import to_fp32

if TYPE_CHECKING:
    from orion.models.runtime import TransformerLM

DEFAULT_SLOTS = 8
ROW_BUCKETS = (1, 2, 4, 8, 16)   # the narrower programs, below the slot count
MAX_SLOTS = 32   # the columns one surface row of the ANE holds (ANE-C24)
CHUNK_ROWS = 32  # the tokens a chunk after the first takes: the largest verify bucket
# verify buckets a short prompt goes in by, below the smallest prefill bucket (32): on
# vane a prefill computes all its bucket's columns (the Qwen3-0.6B shape: 241 ms for
# any prompt up to 32 tokens, a verify of 8 rows from position 0 71 ms, of 16 132 ms)
SHORT_PROMPT_ROWS = (8, 16)
PROMISE_ROWS = 16   # the cache rows a zero-tail promise runs ahead by (`_promise`)
# prompts packed into one eval (`pack`): a prompt takes the fewest of PACK_ROWS rows
# holding it, and a pack is PACK_COLUMNS columns, the most for which vane's convs give
# each column its GEMV's bits (and a surface row of the ANE, ANE-C24). Each prompt
# alone reads every weight once for its few tokens (on the Qwen3-0.6B shape's 8 layers,
# 16 prompts of 3 tokens: 182-263 ms one verify each, 107-169 ms in two packs; of 6-8
# tokens 239-263 against 217-243 ms; of 12 tokens, in groups of 16 rows, 400 against 420)
PACK_COLUMNS = 32
PACK_ROWS = (4, 8)


def _nbytes(shape: tuple[int, ...]) -> int:
    return 2 * int(np.prod(shape))


class PromptRun:
    """A prompt going into a slot in chunks (`BatchDecoder.begin`)."""

    def __init__(self, slot: int, ids: Sequence[int], chunk: int | None,
                 adapter: str | None = None) -> None:
        self.slot, self.ids, self.chunk = slot, [int(i) for i in ids], chunk
        self.adapter = adapter   # the LoRA adapter (by the model's name for it) or None
        self.done = 0     # prompt tokens in the model's staging cache
        self.reused = 0   # of them, loaded from a shared prefix

    @property
    def left(self) -> int:
        return len(self.ids) - self.done


def live_columns(slots: Sequence[int]) -> range:
    """The columns a batch program computes for `slots` (sorted): from the first to the
    last (`Program.set_live_columns`). A row reads no other's, so the columns outside
    are read by no one, and each inside keeps the bits it has among all."""
    return range(slots[0], slots[-1] + 1)


class BatchDecoder:
    """B slots of one `TransformerLM` decoded together (see the module docstring).

    slots:   B, the rows of every batch program (1..32)
    context: the most positions a slot holds (prompt and output): a decode bucket of
             the model (the largest one at or under it); None: the model's context.
             KV memory is slots x context x layers x 2 x kv_dim x 2 bytes
    prefix_bytes: memory for prompt prefixes shared across slots
             (`orion.models.shared_prefixes`: a chunked prompt saves its rows up to
             its last cut, and a later prompt starting with them loads them); 0: none
    """

    def __init__(self, model: TransformerLM, slots: int = DEFAULT_SLOTS,
                 context: int | None = None, prefix_bytes: int = 0) -> None:
        from orion.runtime import compile_budget, compile_count

        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise InvalidArgumentError(f"slots must be an integer in [1, {MAX_SLOTS}], got "
                                       f"{slots!r}")
        buckets = list(model._decode_buckets)
        if context is not None:
            if isinstance(context, bool) or not isinstance(context, int) or context < 1:
                raise InvalidArgumentError(f"context must be a positive integer, got {context!r}")
            fitting = [b for b in buckets if b <= context]
            if not fitting:
                raise InvalidArgumentError(f"context {context} is below the model's smallest "
                                           f"decode bucket ({buckets[0]})")
            buckets = fitting
        self.model, self.slots, self.context = model, slots, buckets[-1]
        self._keys: dict[tuple[int, Signature, int], list[ProgramKey]] = {}
        self.buckets = tuple(buckets)
        a, lay = model.config, model._layout
        self._kv, self._hd, self._kvd = a.n_kv_heads, a.head_dim, a.kv_dim
        self._dim = a.dim
        self._specs = model._specs
        windows = sorted({s.window for s in self._specs})
        ropes = list(dict.fromkeys(s.rope for s in self._specs if s.rope is not None))
        # a step runs the programs of the fewest rows holding its highest live slot
        # (slots are handed out lowest first): one stream costs about a decode step
        self.row_buckets = tuple(r for r in ROW_BUCKETS if r < slots) + (slots,)
        left = compile_budget() - compile_count()
        if self._programs_needed() > left:   # then only the full width
            self.row_buckets = (slots,)
        needed = self._programs_needed()
        if needed > left:
            keys = self._layer_keys(self.buckets[0])
            raise PlanError(f"batched decode needs up to {needed} more programs "
                            f"({len(keys)} a bucket for {len(self.buckets)} bucket(s), "
                            f"{len(model.plan.heads)} head(s)) but the process has {left} "
                            "compiles left: pass a smaller context (fewer buckets)")
        self._surfaces: list[Any] = []
        surface = self._surface
        x_block = (slots * lay.rows, lay.width)   # each slot's [D] folded as decode's

        def in_blocks(t: int) -> list[tuple[int, int]]:
            cache = (slots * lay.cache_rows(a.kv_dim, t), lay.width)
            blocks = [x_block, cache, cache, (slots * t, 1)]
            return blocks + ([(2 * slots, a.head_dim)] if ropes else [])

        in_shape = max((surface_shape(in_blocks(t)) for t in self.buckets), key=_nbytes)
        # h is the head's x as it is: one shape serves both
        out_shape = surface_shape([x_block, (slots, a.kv_dim), (slots, a.kv_dim)])
        if in_shape[3] != lay.width or out_shape[3] != lay.width:
            raise PlanError(f"batched decode of {slots} slots does not fit the cache's "
                            f"surface width {lay.width}")
        grid, out_grid = (in_shape[1], in_shape[3]), (out_shape[1], out_shape[3])
        row = lay.items
        widest = max(len(k.layers) for t in self.buckets for k in self._layer_keys(t))
        self._x = surface(in_shape)
        self._k = [surface(in_shape) for _ in range(a.n_layers)]
        self._v = [surface(in_shape) for _ in range(a.n_layers)]
        self._masks = {w: surface(in_shape) for w in windows}
        self._ropes = {r: surface(in_shape) for r in ropes}
        self._h = surface(out_shape)
        self._k_new = [surface(out_shape) for _ in range(widest)]
        self._v_new = [surface(out_shape) for _ in range(widest)]
        chunks = [c for part in model.plan.heads for c in part.chunks]
        padded = [-(-rows // 32) * 32 for _, rows in chunks]
        head_out = surface_shape([(slots * p // 32, 32) for p in padded])
        logit_surfaces = [surface(head_out) for _ in chunks]
        self._head_outs: list[list[Any]] = []
        at = 0
        for part in model.plan.heads:
            self._head_outs.append(logit_surfaces[at: at + len(part.chunks)])
            at += len(part.chunks)
        # slot b's hidden state: row b of [B, R*W], its first D items
        self._x_view = self._x.numpy(np.float16, (slots, row))[:, : a.dim]
        self._h_view = self._h.numpy(np.float16, (slots, row))[:, : a.dim]
        self._new_views = [(k.numpy(np.float16, out_grid)[:slots, : a.kv_dim],
                            v.numpy(np.float16, out_grid)[:slots, : a.kv_dim])
                           for k, v in zip(self._k_new, self._v_new, strict=True)]
        # each chunk's logits of slot b: row b of [B, padded], its first `rows` items
        self._logit_views = [s.numpy(np.float16, (slots, p))[:, :rows]
                             for s, p, (_, rows) in zip(logit_surfaces, padded, chunks,
                                                        strict=True)]
        self._mask_cols = {w: s.numpy(np.float16, grid)[:, 0] for w, s in self._masks.items()}
        self._rope_views = {r: s.numpy(np.float16, grid)[: 2 * slots, : a.head_dim]
                            for r, s in self._ropes.items()}
        self._flats = [s.numpy(np.float16) for s in (*self._k, *self._v)]
        for f in self._flats:
            f[...] = 0
        self._x_view[...] = 0
        self.bucket = self.buckets[0]
        self._heads = self._views(self.bucket)
        self.positions: list[int | None] = [None] * slots   # None: the slot is free
        self._staging: PromptRun | None = None   # the prompt in the model's own cache
        self._waiting_heads: set[int] = set()   # slots whose last hidden state is in _h
        self._promised: tuple[int, int] | None = None   # `_promise`'s (bucket, live rows)
        # `_one_row`'s sequences by (bucket, rows, slot), with the programs they run
        self._sequences: dict[tuple[int, int, int], tuple[list[Any], Any]] = {}
        self._out_width = out_shape[3]   # items of a row of h and the new key, value rows
        self.adapters: list[Adapter | None] = [None] * slots   # each slot's LoRA adapter
        self._in_shape = in_shape
        # (layer, signature) -> its LoRA input surfaces and the adapters they hold
        self._lora_io: dict[tuple[int, Signature], tuple[list[Any], tuple[int, ...]]] = {}
        self.prefixes = SharedPrefixes(prefix_bytes)
        self.short_rows: tuple[int, ...] = ()   # `plan_short_prompts`
        self.verify_rows: tuple[int, ...] = ()  # `plan_verify`: speculation in a slot
        self.pack_rows: tuple[int, ...] = ()    # `plan_packs`
        self._pack_io: dict[str, Any] | None = None   # `pack`'s surfaces, at its first
        self._closed = False

    def _surface(self, shape: tuple[int, ...]) -> Any:
        """A surface of `shape`'s bytes that the decoder owns (released by `close`)."""
        from orion.runtime import Surface

        s = Surface(_nbytes(shape))
        self._surfaces.append(s)
        return s

    # ---- slots ------------------------------------------------------------------------

    def acquire(self) -> int | None:
        """A free slot (it holds nothing until `start`), or None."""
        for s, pos in enumerate(self.positions):
            if pos is None:
                self.positions[s] = 0
                return s
        return None

    def release(self, slot: int) -> None:
        """Frees `slot`: its rows become zero (a later request starts from nothing)."""
        self._check_slot(slot)
        if self._staging is not None and self._staging.slot == slot:
            self._staging = None   # its prompt is dropped half way
        used = self.positions[slot] or 0
        self.adapters[slot] = None
        self._waiting_heads.discard(slot)
        for h in self._heads:
            h[slot, :, :used] = 0
        self.positions[slot] = None
        self._promise()

    def _empty(self, slot: int) -> None:
        """An acquired slot that holds rows from an earlier prompt made empty again."""
        if self.positions[slot]:
            self.release(slot)
            self.positions[slot] = 0

    @property
    def kv_bytes(self) -> int:
        """The bytes the slots' key and value caches take (at their full context)."""
        return 2 * len(self._k) * self.slots * self.context * self._kvd * 2

    @property
    def live(self) -> int:
        return sum(p is not None for p in self.positions)

    def start(self, slot: int, ids: Sequence[int], chunk: int | None = None,
              adapter: str | None = None) -> np.ndarray:
        """Runs `ids` as slot `slot`'s prompt (from position 0) to its end, `begin`'s
        chunks back to back with no step between them (in one prefill when `chunk` is
        None): fp32 logits [vocab] of its last position."""
        run = self.begin(slot, ids, chunk, adapter)
        logits = None
        while logits is None:
            logits = self.advance(run)
        return logits

    def begin(self, slot: int, ids: Sequence[int], chunk: int | None = None,
              adapter: str | None = None) -> PromptRun:
        """Makes `ids` slot `slot`'s prompt, to run by `advance`: the first `chunk`
        tokens (all of them when None) by the model's prefill, then `CHUNK_ROWS` a call
        (the model's verify). One prompt at a time: the model's cache stages it.
        `adapter`: a LoRA adapter the model holds (`load_adapter`), which this slot's
        prompt and steps compute with, beside slots with others or none (the prompt
        goes in whole: the verify programs have no LoRA inputs)."""
        self._check_slot(slot)
        if self._closed:
            raise StateError("the batch decoder is closed")
        model = self.model
        if model.active_adapter is not None:
            raise StateError("batched decode runs the base model: select no adapter "
                             f"(the model has {model.active_adapter!r} selected)")
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)
                                  or chunk < 1):
            raise InvalidArgumentError(f"chunk must be a positive integer, got {chunk!r}")
        if not ids:
            raise InvalidArgumentError("a prompt needs at least one token")
        if len(ids) >= self.context:
            raise InvalidArgumentError(f"a prompt of {len(ids)} tokens leaves no room in a "
                                       f"slot of {self.context} positions")
        if self._staging is not None:
            raise StateError(f"slot {self._staging.slot}'s prompt is still going in: "
                             "one prompt at a time")
        self._empty(slot)
        if adapter is not None:
            model.adapters.get(adapter)   # a LoraError naming it when the model has none
            chunk = None
        run = PromptRun(slot, ids, chunk, adapter)
        if chunk is not None and len(ids) > chunk:
            model.plan_verify(CHUNK_ROWS)   # counted against the compile budget
            found = self.prefixes.find(run.ids, chunk_cuts(len(ids), chunk, CHUNK_ROWS))
            if found is not None:   # its first `cut` rows as its own chunks left them
                cut, rows = found
                model.load_rows([(k[:, :cut], v[:, :cut]) for k, v in rows])
                run.done = run.reused = cut
        self._staging = run
        return run

    def advance(self, run: PromptRun, defer_head: bool = False) -> np.ndarray | None:
        """Runs `run`'s next chunk: None while tokens are left, else the prompt is in
        its slot and these are the fp32 logits [vocab] of its last position. With
        `defer_head`, a last piece that runs by a verify leaves its last hidden state
        in the slot's row of the batch head instead and returns None with no tokens
        left (`run.left` 0): `heads` then computes the logits of every such slot in one
        eval (the bits decode's head gives each: a row's logits do not depend on the
        others), where each prompt's own head would read the head's weights again."""
        if run is not self._staging:
            raise StateError("this prompt is not the one going in (released, finished "
                             "or another's)")
        model = self.model
        waits = False   # the logits wait for `heads`
        try:
            if run.adapter is not None:   # the whole prompt, its adapter selected
                piece = run.ids
                model.set_adapter(run.adapter)
                try:
                    logits = model.prefill(piece)
                finally:
                    model.set_adapter(None)
            elif run.done == 0:
                piece = run.ids if run.chunk is None else run.ids[: run.chunk]
                waits = defer_head and len(piece) == run.left and self._short(piece)
                logits = self._first_piece(piece, waits)
            else:
                piece = run.ids[run.done: run.done + CHUNK_ROWS]
                waits = defer_head and len(piece) == run.left
                logits = self._verify_last(piece, waits)
        except BaseException:
            self._staging = None
            raise
        run.done += len(piece)
        if run.left:
            return None
        self._staging = None
        slot, n = run.slot, run.done   # (model.position is 0 once its adapter is unselected)
        cuts = chunk_cuts(n, run.chunk, CHUNK_ROWS) if run.chunk is not None else []
        if cuts and self.prefixes.max_bytes:
            cut = cuts[-1]
            self.prefixes.save(run.ids[:cut], lambda: self._staged_rows(cut))
        self._lay_out(max(n, self._furthest()))
        for layer in range(len(self._k)):
            k, v = model._cache.layer_rows(layer, n)
            self._heads[layer][slot, :, :n] = k
            self._heads[len(self._k) + layer][slot, :, :n] = v
        self.positions[slot] = n
        self.adapters[slot] = None if run.adapter is None else model.adapters.get(run.adapter)
        self._promise()
        if waits:   # `logits` is the last hidden state
            self._h_view[slot] = logits
            self._waiting_heads.add(slot)
            return None
        return logits

    @property
    def waiting_heads(self) -> frozenset[int]:
        """The slots whose prompt's logits wait for `heads`."""
        return frozenset(self._waiting_heads)

    def heads(self) -> dict[int, np.ndarray]:
        """The logits of the prompts `advance(defer_head=True)` left waiting: one eval
        of the batch head programs of the fewest rows holding them. slot -> fp32
        logits [vocab]."""
        if self._closed:
            raise StateError("the batch decoder is closed")
        slots = sorted(self._waiting_heads)
        if not slots:
            return {}
        keys = self._head_keys(self._rows_holding(slots[-1]))
        self._waiting_heads.clear()   # run or failed, they wait no more
        self.model._build(keys)
        live = live_columns(slots)
        for key, outs in zip(keys, self._head_outs, strict=True):
            self.model._run(key, [self._h], outs, live=live)
        return {s: self._slot_logits(s) for s in slots}

    def plan_short_prompts(self) -> tuple[int, ...]:
        """Plans the verify programs of `SHORT_PROMPT_ROWS` rows (while the compile
        budget holds them) so that a prompt of up to as many tokens goes in as one
        verify of the smallest holding it, not a prefill of 32 columns; `prepare`
        compiles them. Returns the buckets planned (call before the first prompt: a
        prompt's path must not depend on when it came)."""
        planned: list[int] = []
        for rows in SHORT_PROMPT_ROWS:
            try:
                self.model.plan_verify(rows)
            except PlanError:
                break
            planned.append(rows)
        self.short_rows = tuple(planned)
        return self.short_rows

    def plan_verify(self, rows: int) -> None:
        """Plans the model's verify programs of `rows` rows, every row's logits, for
        `verify` (speculative decoding in a slot); `prepare` compiles them. PlanError
        when the compile budget cannot hold them."""
        self.model.plan_verify(rows)
        self.verify_rows = tuple(sorted({*self.verify_rows, rows}))

    def _first_piece(self, piece: list[int], hidden: bool = False) -> np.ndarray:
        """The logits of a prompt's first piece, run from position 0 in the model's
        cache: one verify when a short-prompt bucket holds it, else a prefill. `hidden`:
        a verify's last hidden state (fp16) in place of its logits."""
        if self._short(piece):
            self.model.reset()
            return self._verify_last(piece, hidden)
        return self.model.prefill(piece)

    def _short(self, piece: list[int]) -> bool:
        """Whether a short-prompt bucket holds a prompt's first piece."""
        return bool(self.short_rows) and len(piece) <= self.short_rows[-1]

    def _verify_last(self, piece: list[int], hidden: bool) -> np.ndarray:
        """The model's verify of `piece`: its last row's fp32 logits, or with `hidden`
        its last hidden state (fp16 [dim])."""
        if hidden:
            return self.model.verify_hidden(piece)
        return self.model.verify(piece, last_only=True)

    def _staged_rows(self, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Copies of positions [0, n) of the model's own cache, every layer."""
        out = []
        for layer in range(len(self._k)):
            k, v = self.model._cache.layer_rows(layer, n)
            out.append((k.copy(), v.copy()))
        return out

    def position(self, slot: int) -> int:
        self._check_slot(slot)
        return self.positions[slot] or 0

    # ---- prompts packed into one eval ---------------------------------------------------

    def plan_packs(self) -> tuple[int, ...]:
        """Plans the prompt pack programs of `PACK_ROWS` rows a prompt (while the compile
        budget holds them beside every program `prepare` builds), so that `pack` runs
        several short prompts in one eval; `prepare` compiles them. Returns the rows
        planned (call before the first prompt: a prompt's path must not depend on when
        it came)."""
        from orion.runtime import compile_budget, compile_count

        left = compile_budget() - compile_count()
        keys = self._prepare_keys()
        planned: list[int] = []
        for rows in PACK_ROWS:
            more = keys + [k for r in (*planned, rows) for k in self._pack_keys(r)]
            if sum(1 for k in dict.fromkeys(more) if not self.model._have(k)) > left:
                break
            planned.append(rows)
        self.pack_rows = tuple(planned)
        return self.pack_rows

    def pack_rows_for(self, n: int) -> int:
        """The rows a prompt of `n` tokens takes in a pack: the fewest planned holding
        it; 0 when none does (it goes in by `begin`)."""
        return min((r for r in self.pack_rows if r >= n), default=0)

    def _pack_keys(self, rows: int) -> list[ProgramKey]:
        """The pack layer programs of `rows` rows a prompt: decode's layer groups."""
        return [ProgramKey("prompts", g.start, rows, (), g.stop - g.start, rows=PACK_COLUMNS)
                for g in self.model.plan.groups_for("verify")]

    def pack(self, prompts: Mapping[int, Sequence[int]]) -> None:
        """Runs each slot's prompt (slot -> ids) from position 0 in one eval of the pack
        programs: every prompt takes the same rows (`pack_rows_for`), at most
        `PACK_COLUMNS` of them in all. Their keys and values go into their slots, and
        their last hidden states wait in the slots' head rows, as `advance(run,
        defer_head=True)` leaves them: `heads` gives their logits. A prompt's group is
        its own (its attention reads no other's rows, and each conv column is its GEMV),
        so its bits do not depend on which group it took or on the others."""
        if self._closed:
            raise StateError("the batch decoder is closed")
        model = self.model
        if model.active_adapter is not None:
            raise StateError("batched decode runs the base model: select no adapter")
        if not prompts:
            return
        for s, ids in prompts.items():   # before anything runs: one bad prompt, no pack
            if any(not 0 <= int(t) < self.model.config.vocab_size for t in ids):
                raise InvalidArgumentError(f"slot {s}'s prompt has token ids outside "
                                           f"[0, {self.model.config.vocab_size})")
        sizes = {self.pack_rows_for(len(ids)) for ids in prompts.values()}
        rows = sizes.pop()
        if sizes or not rows or not all(prompts.values()):
            raise InvalidArgumentError(
                f"a pack takes prompts of 1 to {max(self.pack_rows, default=0)} tokens that "
                f"need the same rows of {list(self.pack_rows)}, got "
                f"{sorted(len(ids) for ids in prompts.values())} tokens")
        if len(prompts) > PACK_COLUMNS // rows:
            raise InvalidArgumentError(f"a pack of {rows} rows a prompt holds "
                                       f"{PACK_COLUMNS // rows} prompts, got {len(prompts)}")
        for s in prompts:
            self._check_slot(s)
            if self._staging is not None and self._staging.slot == s:
                raise StateError(f"slot {s}'s prompt is still going in")
            self._empty(s)
        io = self._pack_surfaces()
        self._pack_inputs(io, prompts, rows)
        keys = self._pack_keys(rows)
        model._build(keys)
        self._lay_out(max(max(len(ids) for ids in prompts.values()), self._furthest()))
        try:
            for n, key in enumerate(keys):
                ropes = [io["ropes_in"][r] for r in group_ropes(model.arch, key.layers)]
                outs = [io["h_in"]] + [s for j in range(len(key.layers))
                                       for s in (io["k_in"][j], io["v_in"][j])]
                model._run(key, [io["x_in"], *ropes], outs,
                           then=keys[n + 1] if n + 1 < len(keys) else None,
                           live=range(len(prompts) * rows))
                self._keep_pack_rows(io, key, prompts, rows)
                if n < len(keys) - 1:
                    io["x"][...] = io["h"]
        except BaseException:   # a slot holds nothing of a pack that failed
            for s, ids in prompts.items():
                for head in self._heads:
                    head[s, :, : len(ids)] = 0
            raise
        for g, (s, ids) in enumerate(prompts.items()):
            self.positions[s] = len(ids)
            self.adapters[s] = None
            self._h_view[s] = io["h"][g * rows + len(ids) - 1, : self._dim]
            self._waiting_heads.add(s)
        self._promise()

    def _pack_inputs(self, io: dict[str, Any], prompts: Mapping[int, Sequence[int]],
                     rows: int) -> None:
        """A pack's x (prompt g's embeddings from row g * rows) and ropes (its positions'
        rows: PACK_COLUMNS cos rows, then as many sin rows); the rest zeros."""
        x, model = io["x"], self.model
        x[...] = 0
        for view in io["ropes"].values():
            view[...] = 0
        for g, ids in enumerate(prompts.values()):
            at = g * rows
            x[at: at + len(ids), : self._dim] = model._embed_at(ids, range(len(ids)))
            for rope, view in io["ropes"].items():
                for j in range(len(ids)):
                    row = model._rope_row(rope, j)
                    view[at + j], view[PACK_COLUMNS + at + j] = row[0], row[1]

    def _keep_pack_rows(self, io: dict[str, Any], key: ProgramKey,
                        prompts: Mapping[int, Sequence[int]], rows: int) -> None:
        """The new keys and values of `key`'s layers into each prompt's slot."""
        n_layers = len(self._k)
        for j, i in enumerate(key.layers):
            for g, (s, ids) in enumerate(prompts.items()):
                at, m = g * rows, len(ids)
                for cache, new in ((self._heads[i], io["k"][j]),
                                   (self._heads[n_layers + i], io["v"][j])):
                    cache[s, :, :m] = new[at: at + m].reshape(m, self._kv, self._hd
                                                             ).transpose(1, 0, 2)

    def _pack_surfaces(self) -> dict[str, Any]:
        """`pack`'s own surfaces (the caches and heads are the batch's), at its first:
        x, one rope a RoPE, h and each layer's new keys and values of the widest group."""
        if self._pack_io is not None:
            return self._pack_io
        a, lay = self.model.config, self.model._layout
        n = PACK_COLUMNS
        blocks = [(n * lay.rows, lay.width)] + ([(2 * n, a.head_dim)] if self._ropes else [])
        in_shape = surface_shape(blocks)
        out_shape = surface_shape([(n * lay.rows, lay.width), (n, a.kv_dim)])
        if in_shape[3] != lay.width or out_shape[3] != lay.width:
            raise PlanError(f"a prompt pack of {n} columns does not fit the surface width "
                            f"{lay.width}")
        surface = self._surface
        grid, out_grid = (in_shape[1], in_shape[3]), (out_shape[1], out_shape[3])
        widest = max(len(k.layers) for k in self._pack_keys(PACK_ROWS[0]))
        x_in, h_in = surface(in_shape), surface(out_shape)
        ropes_in = {r: surface(in_shape) for r in self._ropes}
        k_in = [surface(out_shape) for _ in range(widest)]
        v_in = [surface(out_shape) for _ in range(widest)]
        self._pack_io = {
            "x_in": x_in, "h_in": h_in, "ropes_in": ropes_in, "k_in": k_in, "v_in": v_in,
            "x": x_in.numpy(np.float16, (n, lay.items)),
            "h": h_in.numpy(np.float16, (n, lay.items)),
            "ropes": {r: s.numpy(np.float16, grid)[: 2 * n, : a.head_dim]
                      for r, s in ropes_in.items()},
            "k": [s.numpy(np.float16, out_grid)[:n, : a.kv_dim] for s in k_in],
            "v": [s.numpy(np.float16, out_grid)[:n, : a.kv_dim] for s in v_in],
        }
        return self._pack_io

    # ---- speculative decoding in a slot -----------------------------------------------

    @property
    def staging(self) -> bool:
        """Whether a prompt is going in through the model's own cache (`begin`), which
        `verify` needs."""
        return self._staging is not None

    def verify(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        """Runs `tokens` at slot `slot`'s positions p .. p+n-1 in one eval of the
        model's verify programs (K rows of one sequence: speculative decoding's check)
        and writes their keys and values into the slot: fp32 logits [n, vocab], row j
        after tokens[:j+1], as `TransformerLM.verify` gives them. The slot's rows go
        into the model's own cache first, so no prompt may be going in (`staging`);
        `truncate` keeps a prefix of the rows. A slot with a LoRA adapter cannot: the
        verify programs have no LoRA inputs."""
        self._check_slot(slot)
        if self._closed:
            raise StateError("the batch decoder is closed")
        if self._staging is not None:
            raise StateError(f"slot {self._staging.slot}'s prompt is going in through the "
                             "model's cache: verify after it")
        if self.adapters[slot] is not None:
            raise StateError(f"slot {slot} computes with a LoRA adapter: the verify programs "
                             "have no LoRA inputs")
        model, p, n = self.model, self.positions[slot] or 0, len(tokens)
        if model.active_adapter is not None:
            raise StateError("batched decode runs the base model: select no adapter")
        if p < 1:
            raise StateError(f"slot {slot} has no prompt: start it first")
        if not 1 <= n <= self.context - p:
            raise InvalidArgumentError(f"{n} tokens at position {p} do not fit slot "
                                       f"{slot}'s {self.context} positions")
        layers = len(self._k)
        model.load_rows([(self._heads[i][slot, :, :p], self._heads[layers + i][slot, :, :p])
                         for i in range(layers)])
        logits = model.verify([int(t) for t in tokens])
        self._lay_out(p + n)
        for i in range(layers):
            k, v = model._cache.layer_rows(i, p + n)
            self._heads[i][slot, :, p: p + n] = k[:, p:]
            self._heads[layers + i][slot, :, p: p + n] = v[:, p:]
        self.positions[slot] = p + n
        self._promise()
        return logits

    def truncate(self, slot: int, n: int) -> None:
        """Keeps slot `slot`'s first `n` positions (the drafts a verify kept); the rows
        past them become zero, as a released slot's do."""
        self._check_slot(slot)
        p = self.positions[slot] or 0
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= p:
            raise InvalidArgumentError(f"cannot keep {n!r} of slot {slot}'s {p} positions")
        for h in self._heads:
            h[slot, :, n:p] = 0
        self.positions[slot] = n
        self._promise()

    # ---- a step -----------------------------------------------------------------------

    def step(self, tokens: Mapping[int, int]) -> dict[int, np.ndarray]:
        """Advances each slot in `tokens` by its token in one eval of the batch
        programs: slot -> fp32 logits [vocab] after it."""
        if self._closed:
            raise StateError("the batch decoder is closed")
        if not tokens:
            return {}
        model = self.model
        if model.active_adapter is not None:
            raise StateError("batched decode runs the base model: select no adapter")
        if self._waiting_heads:   # their hidden states are the head's input a step writes
            raise StateError(f"slots {sorted(self._waiting_heads)} wait for their prompt's "
                             "logits: run heads() before a step")
        slots = sorted(tokens)
        pos = {}
        for s in slots:
            self._check_slot(s)
            p = self.positions[s] or 0
            if p >= self.context:
                raise InvalidArgumentError(f"slot {s} is full ({self.context} positions)")
            pos[s] = p
        self._lay_out(max(pos.values()) + 1)
        t = self.bucket
        x = self._x_view
        x[...] = 0
        x[slots] = model._embed_at([int(tokens[s]) for s in slots], [pos[s] for s in slots])
        rows = self._rows_holding(slots[-1])
        for w, col in self._mask_cols.items():
            m = col[: rows * t].reshape(rows, t)
            m[...] = MASK_VALUE
            for s in slots:
                m[s, max(0, pos[s] - w + 1) if w else 0: pos[s]] = 0
        for rope, view in self._rope_views.items():   # rows cos rows, then rows sin rows
            view[...] = 0
            for s in slots:
                row = model._rope_row(rope, pos[s])
                view[s], view[rows + s] = row[0], row[1]
        sig = self._signature() if any(self.adapters[s] for s in slots) else ()
        keys = self._layer_keys(t, sig, rows)
        heads = self._head_keys(rows)
        order = keys + heads
        model._build(order)
        if len(slots) == 1 and not sig:   # one C call, as the model's own decode step
            self._one_row(slots[0], pos[slots[0]], keys, heads)
        else:
            self._rows(slots, pos, keys, heads, sig)
        model.stats.decode_calls += 1
        return {s: self._slot_logits(s) for s in slots}

    def _rows_holding(self, slot: int) -> int:
        """The fewest rows of a batch program that hold `slot` (slots are handed out
        lowest first, so one stream runs about a decode step)."""
        return min(r for r in self.row_buckets if r > slot)

    def _head_keys(self, rows: int) -> list[ProgramKey]:
        """The batch head programs of `rows` rows, a part of the plan's head each."""
        return [ProgramKey("batch_head", part, 1, rows=rows)
                for part in range(len(self.model.plan.heads))]

    def _ins(self, key: ProgramKey, sig: Signature) -> list[Any]:
        """A batch layer program's input surfaces, in binding order."""
        ins = [self._x]
        for i in key.layers:
            ins += [self._k[i], self._v[i]]
        ins += [self._masks[w] for w in dict.fromkeys(self._specs[i].window
                                                      for i in key.layers)]
        ins += [self._ropes[r] for r in group_ropes(self.model.arch, key.layers)]
        if sig:
            ins += [s for i in key.layers for s in self._lora_inputs(key, i)]
        return ins

    def _outs(self, key: ProgramKey) -> list[Any]:
        outs = [self._h]
        for j in range(len(key.layers)):
            outs += [self._k_new[j], self._v_new[j]]
        return outs

    def _rows(self, slots: list[int], pos: dict[int, int], keys: list[ProgramKey],
              heads: list[ProgramKey], sig: Signature) -> None:
        """A step's programs run from here, each new key and value row written into
        its slot's cache between them."""
        model, x, n_layers = self.model, self._x_view, len(self._k)
        idx, where = np.array(slots), np.array([pos[s] for s in slots])
        order = keys + heads
        live = live_columns(slots)
        for n, key in enumerate(keys):
            model._run(key, self._ins(key, sig), self._outs(key),
                       then=order[n + 1], live=live)   # its weights start on their way
            for j, i in enumerate(key.layers):
                k_rows, v_rows = self._new_views[j]
                self._heads[i][idx, :, where] = k_rows[idx].reshape(len(slots), self._kv,
                                                                     self._hd)
                self._heads[n_layers + i][idx, :, where] = v_rows[idx].reshape(
                    len(slots), self._kv, self._hd)
            if n < len(keys) - 1:
                x[...] = self._h_view
        for s in slots:
            self.positions[s] = pos[s] + 1
        self._promise()
        for n, (key, outs) in enumerate(zip(heads, self._head_outs, strict=True)):
            # h is the heads' x; after the last, the next step's first program (most
            # often this one) is read ahead while the requests sample
            model._run(key, [self._h], outs, then=order[(len(keys) + n + 1) % len(order)],
                       live=live)

    def _one_row(self, slot: int, pos: int, keys: list[ProgramKey],
                 heads: list[ProgramKey]) -> None:
        """A step of one slot as one `EvalSequence` run (the programs, and the copies
        of the new key and value rows and of h into x between them, in C): the same
        evals as `_rows` without a round trip through Python a program, which cost a
        one-stream step 2-3% against the model's own decode (a sequence too)."""
        from orion.runtime.sequence import EvalSequence

        model = self.model
        progs = [model._loaded(k) for k in keys + heads]
        held = self._sequences.get((self.bucket, keys[0].rows, slot))
        if held is None or not all(a is b for a, b in zip(held[0], progs, strict=True)):
            if held is not None:
                held[1].release()
            seq = EvalSequence()
            row = model._layout.items * 2   # a slot's folded hidden state, in bytes
            kv = self._heads[0]              # [slots, KV, T, hd]: the layout's strides
            # a new row: slot's row of the [rows, width] output, head-major [KV, hd]
            copy = {"rows": self._kv, "row_bytes": self._hd * 2, "src_stride": self._hd * 2,
                    "src_offset": slot * self._out_width * 2,
                    "dst_offset": slot * kv.strides[0], "dst_stride": kv.strides[1],
                    "dst_step": kv.strides[2]}
            for n, (key, prog) in enumerate(zip(keys, progs[: len(keys)], strict=True)):
                seq.eval(prog, self._ins(key, ()), self._outs(key))
                for j, i in enumerate(key.layers):
                    seq.copy(self._k_new[j], self._k[i], **copy)
                    seq.copy(self._v_new[j], self._v[i], **copy)
                if n < len(keys) - 1:
                    seq.copy(self._h, self._x, row_bytes=self._dim * 2,
                             src_offset=slot * row, dst_offset=slot * row)
            for prog, outs in zip(progs[len(keys):], self._head_outs, strict=True):
                seq.eval(prog, [self._h], outs)
            held = self._sequences[self.bucket, keys[0].rows, slot] = (progs, seq)
        live = live_columns([slot])
        for prog in progs:
            prog.set_live_columns(keys[0].rows, len(live), live.start)
        held[1].run(pos)
        self.positions[slot] = pos + 1
        self._promise()
        model._programs[keys[0]].prefetch()   # the next step's first, while it samples

    def _slot_logits(self, slot: int) -> np.ndarray:
        """Slot `slot`'s row of the batch head's logits, as fp32 [vocab]."""
        row = np.empty(sum(v.shape[1] for v in self._logit_views), np.float32)
        at = 0
        for view in self._logit_views:
            to_fp32(view[slot], out=row[at: at + view.shape[1]])
            at += view.shape[1]
        return row

    # ---- the caches -------------------------------------------------------------------

    def _layer_keys(self, cache: int, sig: Signature = (), rows: int | None = None
                    ) -> list[ProgramKey]:
        """The batch layer programs at cache bucket `cache` of `rows` rows (all the
        slots when None): decode's groups."""
        rows = rows or self.slots
        held = self._keys.get((cache, sig, rows))   # every step asks: work it out once
        if held is None:
            inputs = 0
            if sig:
                lora = self.model._batch_lora(ProgramKey("batch", 0, cache, sig, rows=rows))
                assert lora is not None
                inputs = len(lora.chunk_rows(self.model.arch))
            held = self._keys[cache, sig, rows] = [
                replace(k, kind="batch", rows=rows)
                for k in self.model.plan.decode_keys(cache, sig, inputs)]
        return held

    def prepare(self, progress: Any = None) -> int:
        """Compiles (or opens from the program store) and loads every program a step
        may run, each row and cache bucket, with the LoRA signature when the model
        holds adapters, so that no step waits for a compile (a server calls this
        before it serves). `progress(done, total)` is called after each. Returns how
        many programs there are."""
        keys = self._prepare_keys() + [k for rows in self.pack_rows
                                       for k in self._pack_keys(rows)]
        self.model._build(keys, progress)   # with every program unloaded, then loaded
        for key in keys:
            self.model._loaded(key)
        return len(set(keys))

    def _prepare_keys(self) -> list[ProgramKey]:
        """The programs `prepare` builds, but for the prompt packs'."""
        sigs: list[Signature] = [()]
        if self.model.adapters.adapters:
            sigs.append(self._signature())
        keys = [k for rows in self.row_buckets for t in self.buckets for sig in sigs
                for k in self._layer_keys(t, sig, rows)]
        keys += [k for rows in self.row_buckets for k in self._head_keys(rows)]
        if self.short_rows:   # their layers, and decode's head (the last row's logits)
            from orion.models.plan import verify_keys

            plan = self.model.plan
            keys += [k for rows in self.short_rows for t in plan.decode_buckets
                     for k in verify_keys(plan, t, rows)] + plan.head_keys()
        if self.verify_rows:   # speculation's: each row's logits, by the verify heads
            from orion.models.plan import verify_programs

            keys += [k for rows in self.verify_rows
                     for k in verify_programs(self.model.plan, rows)]
        return keys

    def _programs_needed(self) -> int:
        """The compiles every batch program this decoder may run still needs (an
        upper bound: the ones compiled already are not told apart here)."""
        sigs: list[Signature] = [()]
        if self.model.adapters.adapters:   # rows with adapters: the LoRA batch programs
            sigs.append(self._signature())
        layers = sum(len(self._layer_keys(t, sig, rows))
                     for rows in self.row_buckets for t in self.buckets for sig in sigs)
        return layers + len(self.model.plan.heads) * len(self.row_buckets)

    def _signature(self) -> Signature:
        """The batch programs' signature when a row has an adapter: every module any
        adapter the model holds adapts, at the highest of their (bucketed) ranks (a
        row's missing modules and lower ranks are zeros). One signature for every mix
        of adapters: one set of LoRA batch programs, not one a combination."""
        ranks: dict[str, int] = {}
        for adapter in self.model.adapters.adapters.values():
            for module, rank in self.model.plan.lora_signature(adapter):
                ranks[module] = max(rank, ranks.get(module, 0))
        return tuple((m, ranks[m]) for m in self.model.arch.linear_modules() if m in ranks)

    def _lora_inputs(self, key: ProgramKey, layer: int) -> list[Any]:
        """Layer `layer`'s per-row LoRA input surfaces for `key`'s signature, written
        when the slots' adapters changed since (a surface write, no compile)."""
        # packed for every slot, each row's block where a program of any rows reads it
        lora = self.model._batch_lora(replace(key, rows=self.slots))
        assert lora is not None
        held_key = (layer, key.lora)
        now = tuple(id(a) for a in self.adapters)
        surfaces, held = self._lora_io.get(held_key, ([], ()))
        if held != now:
            data = lora.pack(list(self.adapters), layer)
            while len(surfaces) < len(data):
                surfaces.append(self._surface(self._in_shape))
            grid = (self._in_shape[1], self._in_shape[3])
            for surf, rows in zip(surfaces, data, strict=False):
                view = surf.numpy(np.float16, grid)
                view[...] = 0
                view[: rows.shape[0], : rows.shape[1]] = rows
            self._lora_io[held_key] = (surfaces, now)
        return surfaces

    def _views(self, bucket: int) -> list[np.ndarray]:
        n = self.slots * self._kv * bucket * self._hd
        return [f[:n].reshape(self.slots, self._kv, bucket, self._hd) for f in self._flats]

    def _furthest(self) -> int:
        return max((p or 0) for p in self.positions)

    def _lay_out(self, positions: int) -> None:
        """Lays every slot out for the smallest bucket holding `positions`."""
        bucket = smallest_bucket(self.buckets, min(positions, self.context))
        if bucket == self.bucket:
            return
        used = self._furthest()
        new = self._views(bucket)
        for old, dst in zip(self._heads, new, strict=True):
            live = old[:, :, :used].copy()   # the two layouts overlap in memory
            old[:, :, :used] = 0
            dst[:, :, :used] = live
        self.bucket, self._heads = bucket, new
        self._promise()

    def _promise(self) -> None:
        """Each (slot, head) block's rows from the furthest slot's position on are zero
        (`Surface.set_zero_tail`): vane's attention reads only the live rows. The
        promise runs ahead to a multiple of `PROMISE_ROWS` (the rows past a slot's
        position are zeros all the same), so that a step renews it once in as many
        steps: a promise is a call a cache surface, 80 us a step on GPT-2 small."""
        row = 2 * self._hd
        live = min(self.bucket, -(-self._furthest() // PROMISE_ROWS) * PROMISE_ROWS)
        if self._promised == (self.bucket, live):
            return
        self._promised = (self.bucket, live)
        for s in (*self._k, *self._v):
            s.set_zero_tail(self.bucket * row, live * row)

    def _check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.slots:
            raise InvalidArgumentError(f"slot must be an integer in [0, {self.slots}), got "
                                       f"{slot!r}")
        if self.positions[slot] is None:
            raise StateError(f"slot {slot} is not acquired")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _, seq in self._sequences.values():
            seq.release()
        self._sequences = {}
        self._heads, self._flats = [], []
        self._x_view = self._h_view = np.empty(0)
        self._new_views, self._logit_views = [], []
        self._mask_cols, self._rope_views = {}, {}
        for s in self._surfaces:
            s.release()
        self._surfaces = []

    def __enter__(self) -> BatchDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
