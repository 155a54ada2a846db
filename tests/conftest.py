"""Shared fixtures. The suite runs against the installed package, or a build
named by ORION_LIBRARY (the sanitizer run of .ci/run uses that).

ORION_TEST_BACKEND=ane|vane runs every test that does not pin a backend on
that one (it becomes ORION_BACKEND for the session): tests/ane/build_standin.sh
runs the runtime tests so through the ane backend on the stand-in framework.
Tests that take the `backend` fixture get its name ("vane" when unset)."""

from __future__ import annotations

import gc
import os

import pytest

TEST_BACKEND = os.environ.get("ORION_TEST_BACKEND", "")


def pytest_configure(config: pytest.Config) -> None:
    if TEST_BACKEND:
        os.environ["ORION_BACKEND"] = TEST_BACKEND


@pytest.fixture(scope="session")
def backend() -> str:
    """The backend under test; asking for one that is not available is an error, not a skip."""
    name = TEST_BACKEND or "vane"
    from orion.runtime import backends, describe_backend

    if name not in backends():
        raise pytest.UsageError(f"ORION_TEST_BACKEND={name}: {describe_backend(name)}")
    return name


@pytest.fixture(autouse=True, scope="session")
def _suite_compile_budget():
    """The runtime's budget models the device's ~119 compiles per process (ANE-C31),
    and one pytest process runs hundreds of compiling tests: lift it for the
    session. Tests of the budget itself set it explicitly and restore it."""
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)
    yield
    set_compile_budget(old)


@pytest.fixture
def no_leaks():
    """Fails a test that leaves surfaces or programs alive in the C core."""
    from orion.runtime import live_programs, live_surfaces

    gc.collect()
    surfaces, programs = live_surfaces(), live_programs()
    yield
    gc.collect()
    assert live_surfaces() == surfaces, "surfaces leaked"
    assert live_programs() == programs, "programs leaked"
