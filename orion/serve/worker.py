"""The one thread that runs the model: requests wait in a bounded queue and run one
at a time (there is one device, and a model's KV cache holds one sequence).

    worker = Worker(model, max_queue=16)
    job = Job(target, prompt_ids, options, loop)
    worker.submit(job)            # APIError 429 (with Retry-After) when the queue is full
    async for event in job: ...   # ("text", str) ... then ("done", Finished)

A job's client can go away at any time: `job.cancel()` (the routes call it when a
stream's client disconnects) makes the worker drop the job at its next token, or
skip it if it is still queued. Every model call happens on this thread. The model
is wrapped in `PrefixCachedLM`, so a prompt that extends the previous request's
prompt and answer (the next chat turn) reuses the KV cache. Each job runs with the
LoRA adapter its `model` named selected, and the previous selection restored after.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from orion.errors import InvalidArgumentError
from orion.generate import stream_generate
from orion.models.base import CausalLM
from orion.models.prefix_cache import PrefixCachedLM
from orion.serve.errors import APIError
from orion.serve.registry import Target

log = logging.getLogger("orion.serve")
RATE_WINDOW_S = 10.0   # the span /health's tokens_per_s averages over


@dataclass(frozen=True)
class Options:
    """Sampling options of one request (already checked by orion.serve.requests)."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]


@dataclass(frozen=True)
class Finished:
    """The end of a job: OpenAI's finish_reason ("stop" or "length") and the counts."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class Job:
    """One request on its way through the worker; iterate it (on the event loop that
    made it) for its events."""

    def __init__(self, target: Target, prompt_ids: list[int], options: Options,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.target, self.prompt_ids, self.options = target, prompt_ids, options
        self._loop = loop
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def emit(self, kind: str, value: Any) -> None:
        """From the worker thread: hands an event to the job's event loop."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))
        except RuntimeError:   # the loop is closed: nobody is listening any more
            self.cancel()

    async def next_event(self) -> tuple[str, Any]:
        return await self._events.get()

    async def __aiter__(self) -> AsyncIterator[tuple[str, Any]]:
        while True:
            kind, value = await self._events.get()
            yield kind, value
            if kind in ("done", "error"):
                return


class Worker:
    """The model's thread and its bounded queue (see the module docstring)."""

    def __init__(self, model: CausalLM, *, max_queue: int = 16, prompt_cache: str = "auto",
                 max_extend: int = 64, speculative: object = None,
                 draft_tokens: int | None = None) -> None:
        if max_queue < 1:
            raise InvalidArgumentError(f"max_queue must be >= 1, got {max_queue}")
        self.model = PrefixCachedLM(model, max_extend=max_extend, policy=prompt_cache)
        self.max_queue = max_queue
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="orion-serve-model",
                                        daemon=True)
        self._seconds_per_job = 1.0     # a running estimate, for Retry-After
        self.running: Job | None = None
        self._rate: deque[float] = deque()   # when each recent token was generated
        self._rate_lock = threading.Lock()
        self.completed = 0
        self.cancelled = 0
        # speculative decoding (orion.generate): "prompt" or a draft model, for the
        # requests without an adapter (the verify programs have no LoRA inputs)
        self.speculative = speculative
        self._spec_options = {} if speculative is None else {
            "speculative": speculative,
            **({"draft_tokens": draft_tokens} if draft_tokens is not None else {})}
        self.drafted = self.accepted = self.declined = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Lets the current job finish, then ends the thread; queued jobs are dropped."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit("error", APIError(503, "the server is shutting down",
                                           type="server_error"))
        self._queue.put(None)
        self._thread.join(timeout=60)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def slots(self) -> int:
        """Requests that may run at once."""
        return 1

    @property
    def live(self) -> int:
        """Requests running now."""
        return int(self.running is not None)

    @property
    def context(self) -> int:
        """The most positions a request may fill (prompt and answer)."""
        return self.model.max_length

    def tokens_per_s(self) -> float:
        """Generated tokens a second, all requests, over the last RATE_WINDOW_S."""
        with self._rate_lock:
            now = time.monotonic()
            while self._rate and self._rate[0] < now - RATE_WINDOW_S:
                self._rate.popleft()
            return len(self._rate) / RATE_WINDOW_S

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            retry = max(1, math.ceil(self._seconds_per_job * (self.max_queue + 1)))
            raise APIError(429, f"the server's queue is full ({self.max_queue} requests "
                           "waiting); retry later", type="rate_limit_error",
                           code="rate_limit_exceeded",
                           headers={"Retry-After": str(retry)}) from None

    # ---- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled:
                self.cancelled += 1
                continue
            self._run_job(job)

    def _run_job(self, job: Job) -> None:
        """Runs one job on this thread, the model to itself."""
        self.running = job
        t0 = time.perf_counter()
        try:
            self._generate(job)
        except Exception:  # noqa: BLE001 - the thread must outlive any one request
            log.exception("generation failed")
            self.model.reset()
            job.emit("error", APIError(500, "generation failed on the server",
                                       type="server_error"))
        finally:
            self.running = None
            spent = time.perf_counter() - t0
            self._seconds_per_job = 0.8 * self._seconds_per_job + 0.2 * spent

    def _generate(self, job: Job) -> None:
        """Runs a job with its adapter selected (None: the base model), then restores
        the model's selection. Selecting is a surface write (orion.models.adapters); a
        KV cache filled with another adapter is not reused (the model reports position 0)."""
        model = self.model.model
        previous = model.active_adapter
        model.set_adapter(job.target.adapter)
        try:
            self._generate_selected(job)
        finally:
            model.set_adapter(previous)

    def _generate_selected(self, job: Job) -> None:
        self._stream(job, self.model, lambda: self.model.last_cached_tokens)

    def _speculation(self, job: Job) -> dict[str, Any]:
        """`stream_generate`'s speculative options for `job`: none with an adapter."""
        return self._spec_options if job.target.adapter is None else {}

    def _stream(self, job: Job, model: CausalLM, cached_tokens: Callable[[], int]) -> None:
        """Streams a job's generation on `model` to its client, ending with "done"
        (`cached_tokens()`: its prompt tokens a prefix cache served)."""
        o = job.options
        spec = self._speculation(job)
        stream = stream_generate(model, job.prompt_ids, max_tokens=o.max_tokens,
                                 temperature=o.temperature, top_p=o.top_p, seed=o.seed,
                                 stop=list(o.stop), **spec)
        completion, reason, spec_stats = 0, "length", None
        try:
            for response in stream:
                if job.cancelled:     # the client left: free the device at this token
                    self.cancelled += 1
                    return
                if response.text:
                    job.emit("text", response.text)
                if response.stats.generated_tokens > completion:
                    with self._rate_lock:
                        self._rate.append(time.monotonic())
                completion = response.stats.generated_tokens
                spec_stats = response.stats.speculation
                if response.stats.finish_reason is not None:
                    reason = "length" if response.stats.finish_reason == "length" else "stop"
        finally:
            stream.close()
        if spec and spec_stats is not None:
            self.drafted += spec_stats.drafted
            self.accepted += spec_stats.accepted
            self.declined += spec_stats.declined
        self.completed += 1
        job.emit("done", Finished(reason, len(job.prompt_ids), completion, cached_tokens()))
