"""Class 8: work linear in the input. The MIL planner grew its step list one element
per realloc and looked names up by a backward scan, so 40k statements took 128 s under
ASan; it now grows geometrically and hashes names. No timing assert here (speed is
measured in benchmarks/test_bench_plan.py): the sanitizer stage of .ci/run runs this
module too, where quadratic work would take minutes."""

from __future__ import annotations

import numpy as np
import pytest
from vane.milgen import Mil

from orion.runtime import Program

SHAPE = (1, 768, 1, 32)   # the device's smallest I/O size (ANE-C23)


def chain(n: int, fresh_consts: bool) -> str:
    """n adds in a chain; each reads one const defined at the top (the worst case for
    a backward scan) or its own const defined just before it."""
    m = Mil()
    x = m.input("x", SHAPE)
    c = m.const(0.0, "fp16")
    for _ in range(n):
        y = m.const(0.0, "fp16") if fresh_consts else c
        x = m.op("add", SHAPE, x=x, y=y)
    m.op("identity", SHAPE, result_name="out", x=x)
    return m.text(["out"])


@pytest.mark.parametrize("fresh_consts", [False, True])
def test_forty_thousand_statements_compile(fresh_consts):
    n = 40_000 // (2 if fresh_consts else 1)   # 40k statements either way
    with Program.compile(chain(n, fresh_consts), backend="vane") as p:
        assert p.folder.exists()


def test_a_long_chain_still_computes(tmp_path):
    m = Mil()
    x = m.input("x", SHAPE)
    one = m.const(1.0, "fp16")
    for _ in range(2000):
        x = m.op("add", SHAPE, x=x, y=one)
    m.op("identity", SHAPE, result_name="out", x=x)
    with Program.compile(m.text(["out"]), backend="vane") as p:
        p.load()
        feed = np.zeros(SHAPE, np.float16)
        out = p.run({"x": feed})["out"]
    np.testing.assert_array_equal(out, np.full(SHAPE, 2000, np.float16))
