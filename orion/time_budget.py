"""A wall-clock budget for pure-Python work on the calling thread (a chat template's
render): past the budget the call is interrupted where it stands, and the caller gets
`BudgetExceeded` instead of a thread held forever.

    result = within(2.0, lambda: template.render(...))   # BudgetExceeded after 2 s

Hand-written, on CPython's `PyThreadState_SetAsyncExc` (the mechanism behind
KeyboardInterrupt-like interruption of another thread), because no maintained
library offers it for a thread that must stay usable: one watchdog thread raises
`_Interrupt` in a working thread that passed its deadline, at its next bytecode
boundary. It stops Python
loops, not one long C call, so the template sandbox also bounds what a single
operation may allocate (orion.tokenizers.chat_template). A pending interrupt that
the call outran is withdrawn before `within` returns.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from orion.errors import OrionError

T = TypeVar("T")
_set_async_exc = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)


class BudgetExceeded(OrionError):
    """The work ran past its time budget and was stopped."""


class _Interrupt(BaseException):
    """Raised inside the working thread; a BaseException, so that code which catches
    Exception (a template engine's own error handling) cannot swallow it."""


class _Watch:
    """One call's deadline; `fired` once the interrupt was sent, `done` once the call
    ended (both under the watchdog's lock)."""

    def __init__(self, deadline: float) -> None:
        self.thread, self.deadline = threading.get_ident(), deadline
        self.done = self.fired = False


class _Watchdog:
    """One daemon thread for every budget: it sleeps until the earliest deadline and
    interrupts the calls still running past theirs (a thread per call cost ~0.4 ms)."""

    def __init__(self) -> None:
        # Working threads take the plain lock with `with` (C methods only): an interrupt
        # landing in Python code of Condition.__enter__ could leave it held forever.
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.heap: list[tuple[float, int, _Watch]] = []
        self.count = itertools.count()
        self.thread: threading.Thread | None = None

    def watch(self, seconds: float) -> _Watch:
        w = _Watch(time.monotonic() + seconds)
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="orion-time-budget",
                                               daemon=True)
                self.thread.start()
            earliest = not self.heap or w.deadline < self.heap[0][0]
            heapq.heappush(self.heap, (w.deadline, next(self.count), w))
            if earliest:
                self.cond.notify()
        return w

    def release(self, w: _Watch) -> None:
        with self.lock:
            w.done = True
            if w.fired:   # delivered already, or still pending: withdraw a pending one
                assert _set_async_exc is not None
                _set_async_exc(ctypes.c_ulong(w.thread), None)

    def _run(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                while self.heap and self.heap[0][0] <= now:
                    w = heapq.heappop(self.heap)[2]
                    if not w.done:
                        w.fired = True
                        assert _set_async_exc is not None
                        _set_async_exc(ctypes.c_ulong(w.thread), ctypes.py_object(_Interrupt))
                self.cond.wait(self.heap[0][0] - now if self.heap else None)


_WATCHDOG = _Watchdog()


def _after_fork() -> None:
    """A forked child has no watchdog thread, and the lock may have been held by a
    thread that does not exist there: it starts afresh."""
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def within(seconds: float, call: Callable[[], T]) -> T:
    """`call()`, interrupted with BudgetExceeded once it has run `seconds`. Without
    CPython's interrupt (another interpreter) the call runs unbounded."""
    if _set_async_exc is None:
        return call()
    try:
        watch = _WATCHDOG.watch(seconds)
        try:
            return call()
        finally:
            _WATCHDOG.release(watch)
    except _Interrupt:
        raise BudgetExceeded(f"stopped after its budget of {seconds:g} s") from None
