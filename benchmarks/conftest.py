"""Benchmark helpers: a figures table printed at the end of the run, and progress.

Benchmarks compare Orion with the peer a user would pick, in the same run;
`figures.add(...)` records a named figure, `figures.ratio(...)` a comparison,
and the summary prints them all so ratios read at a glance.

A run says what it is doing as it goes, on stderr even when pytest captures output:
each benchmark's start (its number of all, the time since the run began) and end, and
whatever a long benchmark reports through the `progress` fixture (its rounds). The
defaults finish in minutes on two cores; ORION_BENCH_FULL=1 runs the full-size
variants whose figures the README quotes (test_bench_train.py: Stories110M).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from orion.runtime import compile_budget, num_threads, set_compile_budget, set_num_threads

THREADS = 2          # the GPT-2 benchmarks' thread count, for Orion and every peer
FULL = os.environ.get("ORION_BENCH_FULL", "") not in ("", "0")


# ---- progress -------------------------------------------------------------------------

_run = {"config": None, "started": time.monotonic(), "total": 0, "done": 0}


@contextlib.contextmanager
def _uncaptured() -> Iterator[None]:
    """stderr as the terminal's, also while pytest captures a test's output."""
    config = _run["config"]
    capman = config.pluginmanager.getplugin("capturemanager") if config else None
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        yield


def say(message: str) -> None:
    """One progress line on stderr: the time since the run began, then `message`."""
    spent = int(time.monotonic() - _run["started"])
    config = _run["config"]
    reporter = config.pluginmanager.getplugin("terminalreporter") if config else None
    with _uncaptured():
        if reporter is not None:
            reporter.ensure_newline()   # not after pytest's dots on the same line
        print(f"[bench {spent // 60:d}m{spent % 60:02d}s] {message}", file=sys.stderr,
              flush=True)


def pytest_configure(config) -> None:
    _run["config"] = config
    # compiles are part of what the benchmarks measure: programs kept by an earlier run
    # would skip them (test_bench_layer_programs.py turns the store on where it times it)
    os.environ.setdefault("ORION_PROGRAM_STORE", "off")


def pytest_collection_finish(session) -> None:
    _run["total"] = len(session.items)
    if _run["total"]:
        say(f"{_run['total']} benchmarks to run"
            + ("" if FULL else " (the short defaults; ORION_BENCH_FULL=1 for full size)"))


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _run["done"] += 1
    say(f"{_run['done']}/{_run['total']} {nodeid} ...")


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        say(f"    {report.outcome} in {report.duration:.1f} s")


@pytest.fixture
def progress(request) -> Callable[[str], None]:
    """progress("round 3/6"): a line on stderr naming the running benchmark."""
    name = request.node.name
    return lambda message: say(f"    {name}: {message}")


@dataclass
class Figures:
    rows: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, value: float, unit: str) -> None:
        self.rows.append((name, f"{value:,.3f} {unit}"))

    def text(self, name: str, value: str) -> None:
        """A figure that is not one number (a run's rounds, side by side)."""
        self.rows.append((name, value))

    def ratio(self, name: str, ours: float, theirs: float, better: str = "higher") -> float:
        """Records ours/theirs; `better` says which direction is good, for the reader."""
        ratio = ours / theirs if theirs else float("inf")
        self.rows.append((name, f"{ratio:.2f}x ({better} is better)"))
        return ratio


_FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return _FIGURES


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    """GPT-2 small with transformers' random init, saved once for every GPT-2 benchmark."""
    torch = pytest.importorskip("torch", reason="the GPT-2 weights come from transformers")
    transformers = pytest.importorskip("transformers", reason="GPT-2 is transformers' class")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config()          # GPT-2 small: 12 x 768, 50257 tokens
    model = transformers.GPT2LMHeadModel(cfg).eval()
    folder = tmp_path_factory.mktemp("gpt2_bench")
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def threads():
    """THREADS for vane and PyTorch, and a compile budget for every bucket's programs."""
    torch = pytest.importorskip("torch", reason="the GPT-2 peers include PyTorch")
    old_torch, old_vane, old_budget = torch.get_num_threads(), num_threads(), compile_budget()
    torch.set_num_threads(THREADS)
    set_num_threads(THREADS)
    set_compile_budget(max(old_budget, 1000))
    yield THREADS
    torch.set_num_threads(old_torch)
    set_num_threads(old_vane)
    set_compile_budget(old_budget)


def median_seconds(benchmark) -> float:
    """The median time of a finished pytest-benchmark run, or of its single call when
    benchmarks are disabled."""
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return float("nan")
    return float(stats.stats.median)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _FIGURES.rows:
        return
    terminalreporter.section("Orion figures (this machine, this run)")
    width = max(len(name) for name, _ in _FIGURES.rows)
    for name, value in _FIGURES.rows:
        terminalreporter.write_line(f"{name:<{width}}  {value}")
