"""orion.train.distributed: collectives between 2 real ranks on localhost (MLX's ring
backend), the start-up agreement, the watchdog that bounds every collective."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from child_process import OUTSIDE, child_env

from orion.train.distributed import TIMEOUT_EXIT_CODE, reduce_error_bound

SCRIPT = str(Path(__file__).with_name("collective_rank.py"))


def _results(ranks, mode: str) -> list[dict]:
    procs = ranks.start([[SCRIPT, mode], [SCRIPT, mode]])
    out = []
    for p in procs:
        code, text = ranks.finish(p)
        assert code == 0, text
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


@pytest.mark.slow
def test_reduction_error_within_the_stated_bound(ranks):
    for r in _results(ranks, "reduce"):
        # fp32 with 2 ranks is one add, a + b: the premise of bit-identical training
        assert r["float32_bit_exact"]
        for dtype in ("bfloat16", "float16"):
            # within the bound, and the bound is not vacuous (the worst case is near it)
            assert 0.05 < r[dtype] <= 1.0, (dtype, r[dtype])


@pytest.mark.slow
def test_a_failing_rank_stops_the_others_naming_it(ranks):
    r0, r1 = _results(ranks, "fail")
    assert "rank 1 failed" in r0["error"] and r0["error"].startswith("rank 0:")
    assert "error" not in r1


def test_bound_formula():
    # 2 ranks of |g| = 1 each in bf16: 2 * 2^-8 * (1 + 2^-8)^2 * 2
    b = reduce_error_bound("bfloat16", 2, np.array([2.0]))
    assert b[0] == pytest.approx(4 * 2.0 ** -8 * (1 + 2.0 ** -8) ** 2)


def test_watchdog_ends_a_blocked_process_naming_its_rank():
    code = ("import time; from orion.train.distributed import Watchdog\n"
            "with Watchdog(3, 0.5).guard('the gradient all-reduce'):\n"
            "    time.sleep(30)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=20, env=child_env(), cwd=OUTSIDE)
    assert p.returncode == TIMEOUT_EXIT_CODE
    assert "rank 3: the gradient all-reduce did not complete within 0.5 s" in p.stderr
