"""Parse + verify + plan time of long MIL programs on vane: 10k, 20k and 40k chained
adds that all read one early const (a backward name scan made this quadratic). The
figure to read is the time per statement staying flat as programs grow."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from orion.runtime import Program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hostile.test_large_input import chain  # noqa: E402


@pytest.mark.parametrize("n", [10_000, 20_000, 40_000])
def test_plan_long_program(benchmark, figures, n):
    text = chain(n, fresh_consts=False)

    def compile_once():
        t0 = time.perf_counter()
        with Program.compile(text, backend="vane"):
            pass
        return time.perf_counter() - t0

    seconds = benchmark.pedantic(compile_once, rounds=3, iterations=1)
    figures.add(f"MIL parse+plan, {n} statements, per statement", seconds / n * 1e6, "us")
