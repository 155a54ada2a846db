"""orion.time_budget: a call interrupted at its deadline, and never later."""

from __future__ import annotations

import threading
import time

import pytest

from orion.time_budget import BudgetExceeded, within


def spin() -> None:
    while True:
        pass


def test_a_loop_is_stopped_at_its_budget():
    t0 = time.monotonic()
    with pytest.raises(BudgetExceeded, match="0.2 s"):
        within(0.2, spin)
    assert time.monotonic() - t0 < 5


def test_a_call_within_its_budget_returns_its_value():
    assert within(5, lambda: 42) == 42


def test_no_interrupt_arrives_after_the_call_returned():
    """Budgets that run out as the call ends: the interrupt is withdrawn, never
    raised in whatever the thread does next."""
    stopped = 0
    for _ in range(2000):
        try:
            within(0.0001, lambda: sum(range(500)))
        except BudgetExceeded:
            stopped += 1
    end = time.monotonic() + 0.3
    while time.monotonic() < end:   # an interrupt still pending would land here
        pass
    assert stopped < 2000


def test_each_thread_gets_its_own_deadline():
    results: dict[int, str] = {}

    def work(k: int) -> None:
        try:
            within(0.1 * (k + 1), spin)
        except BudgetExceeded:
            results[k] = "stopped"

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == {k: "stopped" for k in range(4)}


def test_code_that_catches_exception_cannot_swallow_the_interrupt():
    def stubborn() -> None:
        while True:
            try:
                spin()
            except Exception:  # noqa: BLE001 - what a template engine might do
                pass

    with pytest.raises(BudgetExceeded):
        within(0.1, stubborn)


def test_a_forked_child_has_its_own_watchdog():
    import os

    within(1, lambda: None)   # the parent's watchdog thread is running
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child reports by its exit status
        try:
            within(0.2, spin)
        except BudgetExceeded:
            os._exit(7)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 7
