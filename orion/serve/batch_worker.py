"""The worker of a batching server: up to `slots` requests run at once, each on a
thread of its own, decoding together through a `BatchScheduler`
(`orion.serve.batching`).

    worker = BatchWorker(model, max_queue=16, slots=8)

Requests wait in the same bounded queue as `Worker`'s (a full queue is a 429); a
request leaves it for the next free slot. A request that names a LoRA adapter runs in
the same batch as the others: each row of a step computes with its own request's
adapter, or none (`orion.models.adapters.BatchLora`).

With `speculative="prompt"`, a request drafts by prompt lookup and verifies its
drafts in one eval while it decodes alone (`SlotLM.verify_pays`); beside others it
decodes plainly, their rows filling the columns its drafts would. Greedy requests and
unseeded sampling speculate; a seeded sampled request does not, so that its text does
not depend on what else the server runs (speculative sampling draws other random
numbers than plain sampling).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from orion.errors import InvalidArgumentError
from orion.serve.batching import DEFAULT_PREFILL_CHUNK, PROMPT_ROUND_S, BatchScheduler, SlotLM
from orion.serve.errors import APIError
from orion.serve.worker import Job, Worker

log = logging.getLogger("orion.serve")


class BatchWorker(Worker):
    """`Worker`'s queue, with a slot a running request (see the module docstring)."""

    def __init__(self, model: Any, *, max_queue: int = 16, slots: int = 8,
                 context: int | None = None,
                 prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
                 prefix_bytes: int = 0, prompt_round_s: float = PROMPT_ROUND_S,
                 speculative: object = None, draft_tokens: int | None = None) -> None:
        from orion.generate import DRAFT_TOKENS, check_draft_tokens
        from orion.models.plan import verify_rows
        from orion.speculative import PromptLookup

        if speculative is not None and speculative != "prompt" and \
                not isinstance(speculative, PromptLookup):
            raise InvalidArgumentError("a batching server speculates by prompt lookup alone "
                                       "(\"prompt\"): a draft model follows one sequence; "
                                       "serve one request at a time (batch slots 0) for it")
        if draft_tokens is not None:
            check_draft_tokens(draft_tokens)
        # no prefix cache for the requests run alone: the batch's prompts go through
        # the same model cache, so what it holds is never known
        super().__init__(model, max_queue=max_queue, prompt_cache="off",
                         speculative=speculative, draft_tokens=draft_tokens)
        if slots < 1:
            raise InvalidArgumentError(f"slots must be >= 1, got {slots}")
        rows = None if speculative is None else verify_rows(1 + (draft_tokens or DRAFT_TOKENS))
        self.scheduler = BatchScheduler(model, slots=slots, context=context,
                                        prefill_chunk=prefill_chunk,
                                        prefix_bytes=prefix_bytes,
                                        prompt_round_s=prompt_round_s, verify_rows=rows)
        self._slots = slots
        self._free = threading.Semaphore(slots)
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def context(self) -> int:
        return self.scheduler.batch.context

    @property
    def live(self) -> int:
        return len(self._threads)

    def start(self) -> None:
        self.scheduler.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        for t in list(self._threads):
            t.join(timeout=60)
        self.scheduler.stop()

    @property
    def alive(self) -> bool:
        return super().alive and self.scheduler.alive

    def _speculation(self, job: Job) -> dict[str, Any]:
        """Worker's, but not for a seeded sampled request (see the module docstring)."""
        o = job.options
        if o.temperature > 0 and o.seed is not None:
            return {}
        return super()._speculation(job)

    def _run_job(self, job: Job) -> None:
        """Starts the job on a thread of its own once a slot is free (the queue's
        thread waits for one, so the queue holds the rest)."""
        self._free.acquire()
        lm = self.scheduler.slot_lm()
        if lm is None:   # cannot be: a slot is free for each permit
            self._free.release()
            job.emit("error", APIError(503, "no decode slot is free", type="server_error"))
            return
        t = threading.Thread(target=self._slot_thread, args=(job, lm),
                             name=f"orion-serve-slot{lm.slot}", daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()

    def _slot_thread(self, job: Job, lm: SlotLM) -> None:
        t0 = time.perf_counter()
        try:
            lm.set_adapter(job.target.adapter)
            self._stream(job, lm, lambda: lm.cached_tokens)
        except Exception:  # noqa: BLE001 - one request's failure is its own
            log.exception("generation failed")
            job.emit("error", APIError(500, "generation failed on the server",
                                       type="server_error"))
        finally:
            lm.release()
            self._free.release()
            with self._lock:
                self._threads.discard(threading.current_thread())
            spent = time.perf_counter() - t0
            self._seconds_per_job = 0.8 * self._seconds_per_job + 0.2 * spent / self._slots
