"""Shared fixtures. The suite runs against the installed package, or a build
named by ORION_LIBRARY (the sanitizer run of .ci/run uses that).

ORION_TEST_BACKEND=ane|vane runs every test that does not pin a backend on
that one (it becomes ORION_BACKEND for the session): tests/ane/build_standin.sh
runs the runtime tests so through the ane backend on the stand-in framework.
Tests that take the `backend` fixture get its name ("vane" when unset)."""

from __future__ import annotations

import gc
import os
import re
from pathlib import Path

import pytest
from asset_paths import require_asset

TEST_BACKEND = os.environ.get("ORION_TEST_BACKEND", "")


def pytest_configure(config: pytest.Config) -> None:
    if TEST_BACKEND:
        os.environ["ORION_BACKEND"] = TEST_BACKEND
    # Programs kept across processes would make every compile count depend on what
    # ran before: the suite compiles; the store's own tests turn it on in a folder
    # of their own (tests/models/test_program_store.py).
    os.environ.setdefault("ORION_PROGRAM_STORE", "off")


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


# CI (.ci/run sets ORION_CI=1) installs every extra the tests use, so a skip there is
# a missing dependency or a broken fixture unless its reason says where the test
# does run ("runs in CI", "runs on Linux and macOS"): such a skip fails the run
# instead of passing quietly.
UNEXPLAINED_SKIPS: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def _note_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or os.environ.get("ORION_CI") != "1":
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(
        report.longrepr)
    if not re.search(r"\bruns\b", reason):
        UNEXPLAINED_SKIPS.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if UNEXPLAINED_SKIPS:
        print("\nORION_CI=1: skips that do not say where the test runs:")
        for line in UNEXPLAINED_SKIPS:
            print("  " + line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def gpt2_files() -> Path:
    """The folder with OpenAI's encoder.json and vocab.bpe (tests/data/gpt2)."""
    require_asset("gpt2/vocab.bpe")
    return require_asset("gpt2/encoder.json").parent
