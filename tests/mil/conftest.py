"""The MIL tests compile many programs (every refusal is a compile attempt, and the
fuzz tests may compile what they generate): lift the per-process budget (ANE-C31)
for them, and put it back after."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _mil_compile_budget():
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)
    yield
    set_compile_budget(old)
