"""Compile time of a full GPT-2 small layer stack (12 layers, d=768, 12 heads, MLP 3072,
S=256), from the IR to loaded programs on vane.

Two phases, timed apart: lowering (legalization passes, partitioning, MIL and blob
emission: the Python front end) and compile + load of every program (parse, verify
and plan in the C core). No peer runs here: the compile paths a user would otherwise
pick (coremltools conversion, the ANE compiler itself) need a Mac.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from orion.ir.compile import compile_lowered, lower_graph
from orion.runtime import compile_budget, set_compile_budget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the block builders
from ir.blocks import gpt2_stack  # noqa: E402

LAYERS, D, HIDDEN, HEADS, SEQ = 12, 768, 3072, 12, 256
ROUNDS = 3


@pytest.fixture(scope="module")
def stack():
    old = compile_budget()
    set_compile_budget(1_000_000)   # each round spends 12 compiles (ANE-C31 budget)
    g, _ = gpt2_stack(LAYERS, D, HIDDEN, HEADS, SEQ)
    yield g
    set_compile_budget(old)


def test_compile_gpt2_small_stack(benchmark, stack, figures):
    phases: dict[str, list[float]] = {"lower": [], "compile": []}
    n_programs = []

    def build():
        t0 = time.perf_counter()
        lowered = lower_graph(stack)
        t1 = time.perf_counter()
        model = compile_lowered(lowered, backend="vane", load=True)
        t2 = time.perf_counter()
        phases["lower"].append(t1 - t0)
        phases["compile"].append(t2 - t1)
        n_programs.append(len(model.programs))
        model.release()

    benchmark.pedantic(build, rounds=ROUNDS, iterations=1)
    assert n_programs[0] == LAYERS // 2   # two 14 MB layers per program at 32 MiB (ANE-C45)
    lower, comp = min(phases["lower"]), min(phases["compile"])
    benchmark.extra_info.update(programs=n_programs[0], lower_s=lower, compile_load_s=comp)
    figures.add("GPT-2 small x12: IR -> MIL (lower)", lower * 1e3, "ms")
    figures.add("GPT-2 small x12: compile + load (vane)", comp * 1e3, "ms")
    figures.add("GPT-2 small x12: IR -> loaded programs", (lower + comp) * 1e3, "ms")
    figures.add("GPT-2 small x12: per program", (lower + comp) / n_programs[0] * 1e3, "ms")
