"""Fixtures of the vane tests: a compile budget large enough for property tests
(the budget models the device's per-process limit, ANE-C31, which vane only counts)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _vane_compile_budget():
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)
    yield
    set_compile_budget(old)
