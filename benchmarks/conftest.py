"""Benchmark helpers: a figures table printed at the end of the run.

Benchmarks compare Orion with the peer a user would pick, in the same run;
`figures.add(...)` records a named figure, `figures.ratio(...)` a comparison,
and the summary prints them all so ratios read at a glance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from orion.runtime import compile_budget, num_threads, set_compile_budget, set_num_threads

THREADS = 2          # the GPT-2 benchmarks' thread count, for Orion and every peer


@dataclass
class Figures:
    rows: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, value: float, unit: str) -> None:
        self.rows.append((name, f"{value:,.3f} {unit}"))

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
