"""Benchmark helpers: a figures table printed at the end of the run.

Benchmarks compare Orion with the peer a user would pick, in the same run;
`figures.add(...)` records a named figure, `figures.ratio(...)` a comparison,
and the summary prints them all so ratios read at a glance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest


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
