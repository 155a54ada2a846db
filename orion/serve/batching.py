"""Continuous batching: the requests of a server decode together, a token each per
eval of the batch programs (`orion.models.batch.BatchDecoder`).

    scheduler = BatchScheduler(model, slots=8)
    scheduler.start()
    lm = scheduler.slot_lm()            # a CausalLM for one request (None: all taken)
    for piece in stream_generate(lm, ids, ...): ...   # on the request's own thread
    lm.release()

Each request runs the ordinary `stream_generate` on a thread of its own, against a
`SlotLM`: its `prefill` and `decode` hand the work to the scheduler's thread, the only
one that touches the model, and wait for their logits. The scheduler runs a step
when every decoding request has handed in its next token (a request that finishes
leaves at once, and the others go on without it) and, between steps, the next chunk
of the prompt going in (one prompt at a time; `prefill_chunk` tokens first, then 32
a chunk; a prompt of at most 16 tokens in one verify of 8 or 16 rows, not a prefill
of 32 columns; prompts of at most 8 tokens waiting together in one pack eval,
`BatchDecoder.pack`; a prompt's last verify or pack leaves its logits to one batch head of the
prompts going in back to back, up to `HEAD_GROUP` of them, run before the next step
or when no prompt is left). While both have work, prompt chunks run until
`prompt_round_s` of them has passed since the last step, then a step: a long prompt
holds the running streams for a round at a time, not for its whole prefill, prompts
arriving together go in back to back, and a request joins at the step after its last
chunk. Sampling, stop strings, seeds and the streamed text are `stream_generate`'s,
per request.

A request's logits do not depend on the others: its prompt is prefilled from
position 0 in chunks cut at the same places whatever else runs (a prefix an earlier
prompt saved at one of those cuts, `prefix_bytes`, is loaded as the very rows its
chunks would make), and each batch row is its slot's decode step alone
(`BatchDecoder`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError, PlanError, StateError
from orion.models.base import ModelStats
from orion.models.batch import CHUNK_ROWS, PACK_COLUMNS, BatchDecoder, PromptRun
from orion.tokenizers.base import Tokenizer

DEFAULT_PREFILL_CHUNK = 128   # a prompt's first chunk: one prefill of up to this
# prompt work between two steps: the running streams wait about this (and a chunk) for
# the prompts waiting, which join the batch sooner (16 prompts at once on the Qwen3-0.6B
# shape, one prompt and one step in turn: median time to the first token 735 ms)
PROMPT_ROUND_S = 0.25
# prompts whose heads run as one batch head: on the Qwen3-0.6B shape a head of 1 row
# takes 9.5 ms, of 8 rows 17 and of 16 33; waiting for 8 keeps most of the saving
# without holding the first prompts' tokens for the last ones (16 prompts at once:
# 206 tok/s against 200 without, median time to the first token 196 ms against 190)
HEAD_GROUP = 8
# a prompt waiting: its slot, ids, adapter (None: the base model) and its logits' future
Prompt = tuple[int, list[int], str | None, Future[np.ndarray]]


class BatchScheduler:
    """The thread that runs the model for every slot (see the module docstring)."""

    def __init__(self, model: Any, *, slots: int = 8, context: int | None = None,
                 prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
                 prefix_bytes: int = 0, prompt_round_s: float = PROMPT_ROUND_S,
                 verify_rows: int | None = None) -> None:
        if prefill_chunk is not None and (isinstance(prefill_chunk, bool) or not isinstance(
                prefill_chunk, int) or prefill_chunk < 1):
            raise InvalidArgumentError(f"prefill_chunk must be a positive integer or None, "
                                       f"got {prefill_chunk!r}")
        if isinstance(prompt_round_s, bool) or not isinstance(prompt_round_s, (int, float)) \
                or not 0 <= prompt_round_s < float("inf"):
            raise InvalidArgumentError(f"prompt_round_s must be a number of seconds >= 0, "
                                       f"got {prompt_round_s!r}")
        self.model = model
        self.batch = BatchDecoder(model, slots=slots, context=context,
                                  prefix_bytes=prefix_bytes if prefill_chunk else 0)
        self.prefill_chunk = prefill_chunk
        if prefill_chunk is not None and prefill_chunk < self.batch.context - 1:
            # the chunks' verify programs, at start-up (PlanError here, not mid-request)
            try:
                model.plan_verify(CHUNK_ROWS)
            except PlanError as exc:
                raise PlanError(f"chunked prefill runs verify programs of {CHUNK_ROWS} "
                                f"rows: {exc}; or prefill each prompt whole "
                                f"(--prefill-chunk 0)") from exc
        self.batch.plan_short_prompts()   # prompts of <= 16 tokens by a verify of 8/16 rows
        self.batch.plan_packs()   # of <= 8, several at once by a pack (`_take_pack`)
        if verify_rows is not None:   # speculative decoding in a slot decoding alone
            self.batch.plan_verify(verify_rows)
        self.batch.prepare()   # every step's programs now: no request waits for a compile
        self._cond = threading.Condition()
        self._prompts: deque[Prompt] = deque()   # waiting
        # the prompt going in: the same, and its run (None until begun)
        self._filling: tuple[int, list[int], str | None, Future[np.ndarray],
                             PromptRun | None] | None = None
        # prompts in, their logits waiting for one batch head of them all: slot, future, run
        self._heads: list[tuple[int, Future[np.ndarray], PromptRun]] = []
        self.prompt_round_s = prompt_round_s
        self._prompt_s = 0.0     # prompt work since the last step: past the round, a step
        self.reused = [0] * slots   # each slot's prompt tokens a shared prefix served
        self._tokens: dict[int, tuple[int, Future[np.ndarray]]] = {}
        # drafts to check (`verify`), and positions to go back to (`truncate`)
        self._verifies: dict[int, tuple[list[int], Future[np.ndarray]]] = {}
        self._truncates: dict[int, int] = {}
        self._decoding: set[int] = set()   # slots past their prompt, not released
        self._releases: list[int] = []     # slots their requests are done with
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="orion-serve-batch", daemon=True)
        self.steps = 0
        self.tokens = 0          # tokens decoded in steps, all slots
        self.verifies = 0        # verify evals run for a slot's drafts
        self.packs = 0           # evals of several short prompts (`_run_pack`)

    # ---- from the request threads -------------------------------------------------

    def slot_lm(self, timeout: float | None = None) -> SlotLM | None:
        """A free slot's CausalLM, waiting up to `timeout` s for one (None: as long as
        it takes) while released slots are freed; None when none came free."""
        with self._cond:
            slot = self.batch.acquire()
            while slot is None and (self._releases or timeout is None) and not self._stopping:
                if not self._cond.wait(timeout):
                    break
                slot = self.batch.acquire()
        return None if slot is None else SlotLM(self, slot)

    def prefill(self, slot: int, ids: Sequence[int], adapter: str | None = None) -> np.ndarray:
        done: Future[np.ndarray] = Future()
        with self._cond:
            self._check_running()
            self._decoding.discard(slot)
            self._prompts.append((slot, list(ids), adapter, done))
            self._cond.notify_all()
        return done.result()

    def decode(self, slot: int, token: int) -> np.ndarray:
        done: Future[np.ndarray] = Future()
        with self._cond:
            self._check_running()
            if slot not in self._decoding:
                raise StateError(f"slot {slot} has no prompt: prefill first")
            self._tokens[slot] = (int(token), done)
            self._cond.notify_all()
        return done.result()

    def verify(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        """Runs `tokens` (the last token and its drafts) from the slot's position in
        one verify eval, at the next step: fp32 logits [rows, vocab]. While a prompt is
        going in through the model's cache the first token alone runs, in the step
        (one row: `orion.speculative` then checks no draft)."""
        if not tokens:
            raise InvalidArgumentError("verify needs at least one token")
        done: Future[np.ndarray] = Future()
        with self._cond:
            self._check_running()
            if slot not in self._decoding:
                raise StateError(f"slot {slot} has no prompt: prefill first")
            self._verifies[slot] = ([int(t) for t in tokens], done)
            self._cond.notify_all()
        return done.result()

    def truncate(self, slot: int, n: int) -> None:
        """Keeps the slot's first `n` positions (the drafts a verify kept), before the
        slot's next step or verify."""
        with self._cond:
            if isinstance(n, bool) or not isinstance(n, int) or \
                    not 0 <= n <= self.position(slot):
                raise InvalidArgumentError(f"cannot keep {n!r} of slot {slot}'s "
                                           f"{self.position(slot)} positions")
            self._truncates[slot] = n

    def position(self, slot: int) -> int:
        """The slot's position as its request sees it (a pending `truncate` applied)."""
        with self._cond:
            held = self._truncates.get(slot)
            return held if held is not None else self.batch.positions[slot] or 0

    def decodes_alone(self, slot: int) -> bool:
        """Whether `slot` is the only request decoding and no prompt waits: a verify
        of its drafts then holds up no one (`SlotLM.verify_pays`)."""
        with self._cond:
            return (self._decoding == {slot} and not self._prompts
                    and self._filling is None and not self._heads)

    def release(self, slot: int) -> None:
        """The request is done with `slot`: the scheduler frees it before its next
        prompt or step (its thread alone touches the caches)."""
        with self._cond:
            self._decoding.discard(slot)
            self._tokens.pop(slot, None)
            self._verifies.pop(slot, None)
            self._truncates.pop(slot, None)
            self._releases.append(slot)
            self._cond.notify_all()

    def _check_running(self) -> None:
        if self._stopping:
            raise StateError("the server is shutting down")

    # ---- figures ------------------------------------------------------------------

    @property
    def running(self) -> int:
        return self.batch.live

    @property
    def prompts_waiting(self) -> int:
        """Prompts handed in whose first chunk has not run."""
        with self._cond:
            return len(self._prompts)

    # ---- the thread ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            for _, _, _, done in self._prompts:
                done.set_exception(StateError("the server is shutting down"))
            for _, done, _ in self._heads:
                done.set_exception(StateError("the server is shutting down"))
            self._heads.clear()
            for _, done in (*self._tokens.values(), *self._verifies.values()):
                done.set_exception(StateError("the server is shutting down"))
            self._prompts.clear()
            self._tokens.clear()
            self._verifies.clear()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self.batch.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _step_ready(self) -> bool:
        handed = self._tokens.keys() | self._verifies.keys()
        return bool(handed) and self._decoding <= handed

    def _ready(self) -> bool:
        return (bool(self._prompts) or self._filling is not None or bool(self._releases)
                or bool(self._heads) or self._step_ready())

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._cond:
                stopped = [h[1] for h in self._heads]
                self._heads = []
                if self._filling is not None:   # stopped with a prompt half in
                    stopped.append(self._filling[3])
                    self._filling = None
            for done in stopped:
                if not done.done():
                    done.set_exception(StateError("the server is shutting down"))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._ready():
                    self._cond.wait()
                if self._stopping:
                    return
                if self._releases:
                    for slot in self._releases:
                        self.batch.release(slot)
                    self._heads = [h for h in self._heads if h[0] not in self._releases]
                    self._releases = []
                    self._cond.notify_all()   # a request may be waiting for a slot
                for slot, n in self._truncates.items():
                    self.batch.truncate(slot, n)
                self._truncates = {}
                step: dict[int, tuple[int, Future[np.ndarray]]] = {}
                verifies: dict[int, tuple[list[int], Future[np.ndarray]]] = {}
                pack: list[Prompt] = []
                prompt_work = self._filling is not None or bool(self._prompts)
                if self._step_ready() and (self._prompt_s >= self.prompt_round_s
                                           or not prompt_work):
                    step, self._tokens = self._tokens, {}   # every decoding slot's token
                    verifies, self._verifies = self._verifies, {}
                    self._prompt_s = 0.0
                elif prompt_work and self._filling is None:
                    pack = self._take_pack()
                    if not pack:
                        self._filling = (*self._prompts.popleft(), None)
            # the prompts' heads wait while more prompts go in back to back, then run as
            # one batch head (one read of its weights for them all), before any step
            if self._heads and (step or verifies or (self._filling is None and not pack)
                                or len(self._heads) >= HEAD_GROUP
                                or self._prompt_s >= self.prompt_round_s):
                self._run_heads()
            if step or verifies:
                self._run_step(step, verifies)
            elif pack:
                t0 = time.perf_counter()
                self._run_pack(pack)
                self._prompt_s += time.perf_counter() - t0
            elif self._filling is not None:
                t0 = time.perf_counter()
                self._run_chunk()
                self._prompt_s += time.perf_counter() - t0

    def _take_pack(self) -> list[Prompt]:
        """The waiting prompts that go in by one pack (`BatchDecoder.pack`): when the
        first one goes by a pack, it and the next ones of its rows, as many as a pack
        holds (the others keep their order); else none. Called holding the lock."""
        rows = self._pack_rows(self._prompts[0]) if self._prompts else 0
        if not rows:
            return []
        taken: list[Prompt] = []
        kept: deque[Prompt] = deque()
        for prompt in self._prompts:
            if len(taken) < PACK_COLUMNS // rows and self._pack_rows(prompt) == rows:
                taken.append(prompt)
            else:
                kept.append(prompt)
        self._prompts = kept
        return taken

    def _pack_rows(self, prompt: Prompt) -> int:
        """The rows a waiting prompt takes in a pack; 0 when it goes in by `begin`: an
        adapter's (the pack programs have no LoRA inputs), one longer than the first
        chunk, or one with ids outside the vocabulary (it fails alone, not its pack)."""
        _, ids, adapter, _ = prompt
        rows = self.batch.pack_rows_for(len(ids))
        if not rows or adapter is not None or (self.prefill_chunk is not None
                                               and len(ids) > self.prefill_chunk):
            return 0
        vocab = self.model.config.vocab_size
        return 0 if any(not 0 <= t < vocab for t in ids) else rows

    def _run_pack(self, pack: list[Prompt]) -> None:
        """The prompts of `_take_pack` in one eval; their logits come from the next
        batch head."""
        try:
            self.batch.pack({slot: ids for slot, ids, _, _ in pack})
        except Exception as exc:  # noqa: BLE001 - handed to the requests' threads
            for *_, done in pack:
                done.set_exception(exc)
            return
        with self._cond:
            self.packs += 1
            self._heads += [(slot, done, PromptRun(slot, ids, None))
                            for slot, ids, _, done in pack]

    def _run_chunk(self) -> None:
        """The next chunk of the prompt going in; its request gets the logits after
        the last one."""
        assert self._filling is not None
        slot, ids, adapter, done, run = self._filling
        try:
            if run is None:
                run = self.batch.begin(slot, ids, self.prefill_chunk, adapter)
                self._filling = (slot, ids, adapter, done, run)
            logits = self.batch.advance(run, defer_head=True)
        except Exception as exc:  # noqa: BLE001 - handed to the request's thread
            self._filling = None
            done.set_exception(exc)
            return
        if logits is None:
            if not run.left:   # in, its logits from the next batch head
                with self._cond:
                    self._filling = None
                    self._heads.append((slot, done, run))
            return
        with self._cond:
            self._filling = None
            self._decoding.add(slot)
            self.reused[slot] = run.reused
        done.set_result(logits)

    def _run_heads(self) -> None:
        """The logits of the prompts whose heads wait, from one batch head."""
        with self._cond:
            waiting, self._heads = self._heads, []
        try:
            out = self.batch.heads()
        except Exception as exc:  # noqa: BLE001 - every waiting request gets it
            for _, done, _ in waiting:
                done.set_exception(exc)
            return
        with self._cond:
            for slot, _, run in waiting:
                self._decoding.add(slot)
                self.reused[slot] = run.reused
        for slot, done, _ in waiting:
            done.set_result(out[slot])

    def _run_step(self, step: dict[int, tuple[int, Future[np.ndarray]]],
                  verifies: dict[int, tuple[list[int], Future[np.ndarray]]]) -> None:
        """Each slot's verify, then one step of the slots that handed in a token."""
        one_row: set[int] = set()   # verifies run as a step's row: the model's cache is busy
        for s, (tokens, done) in verifies.items():
            if self.batch.staging:
                step[s] = (tokens[0], done)
                one_row.add(s)
                continue
            try:
                logits = self.batch.verify(s, tokens)
            except Exception as exc:  # noqa: BLE001 - handed to the request's thread
                done.set_exception(exc)
                continue
            with self._cond:
                self.verifies += 1
            done.set_result(logits)
        if not step:
            return
        try:
            out = self.batch.step({s: tok for s, (tok, _) in step.items()})
        except Exception as exc:  # noqa: BLE001 - every waiting request gets it
            for _, done in step.values():
                done.set_exception(exc)
            return
        with self._cond:
            self.steps += 1
            self.tokens += len(step)
        for s, (_, done) in step.items():
            done.set_result(out[s][None] if s in one_row else out[s])


class SlotLM:
    """One request's view of the batch: a `CausalLM` whose calls run in its slot."""

    def __init__(self, scheduler: BatchScheduler, slot: int) -> None:
        self._scheduler, self.slot = scheduler, slot
        self._model = scheduler.model
        self._adapter: str | None = None
        self._released = False

    @property
    def config(self) -> Any:
        return self._model.config

    @property
    def tokenizer(self) -> Tokenizer:
        return self._model.tokenizer

    @property
    def stats(self) -> ModelStats:
        return self._model.stats

    @property
    def position(self) -> int:
        return self._scheduler.position(self.slot)

    @property
    def max_length(self) -> int:
        return self._scheduler.batch.context

    @property
    def prefill_buckets(self) -> tuple[int, ...]:
        return self._model.prefill_buckets

    @property
    def backend(self) -> str:
        return str(self._model.backend)

    @property
    def active_adapter(self) -> str | None:
        return self._adapter

    def set_adapter(self, name: str | None) -> None:
        """The LoRA adapter (one the model holds) this request's prompt and rows
        compute with, beside rows with other adapters or none; takes effect at the
        next prefill."""
        if name is not None:
            self._model.adapters.get(name)   # LoraError naming those loaded
        self._adapter = name

    @property
    def cached_tokens(self) -> int:
        """The last prompt's tokens loaded from a shared prefix, not run."""
        return self._scheduler.reused[self.slot]

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        if all_logits:
            raise InvalidArgumentError("a batched request gives the last position's logits")
        return self._scheduler.prefill(self.slot, ids, self._adapter)

    def decode(self, token: int) -> np.ndarray:
        return self._scheduler.decode(self.slot, token)

    # ---- speculative decoding (orion.speculative), while the slot decodes alone -------

    def plan_verify(self, rows: int) -> int:
        """The server plans its verify programs at start-up: PlanError for others."""
        planned = self._scheduler.batch.verify_rows
        if rows not in planned:
            raise PlanError(f"the server runs verify programs of {list(planned) or 'no'} "
                            f"rows, not {rows}: speculative decoding is the server's option")
        return 0

    def verify_pays(self) -> bool:
        """Whether a verify of drafts is worth its eval now: only while this request
        decodes alone. Beside others, their rows fill the columns drafts would, and a
        verify would be an eval more for every one of them."""
        return self._adapter is None and self._scheduler.decodes_alone(self.slot)

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        return self._scheduler.verify(self.slot, tokens)

    def truncate(self, n: int) -> None:
        self._scheduler.truncate(self.slot, n)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._scheduler.release(self.slot)
