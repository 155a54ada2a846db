"""The IR's end-to-end tests compile many programs on vane: lift the compile budget
(ANE-C31, which vane only counts) for them, as the vane tests do."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _ir_compile_budget():
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)
    yield
    set_compile_budget(old)
