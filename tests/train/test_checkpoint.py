from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from child_process import OUTSIDE, child_env

from orion.train.checkpoint import load_checkpoint, save_checkpoint


def test_round_trip(tmp_path):
    w = {"model.norm.weight": np.arange(4, dtype=np.float32)}
    opt = {"optim.m.model.norm.weight": np.ones(4, np.float32)}
    meta = {"step": 7, "data": {"rng": {"state": 123}}}
    save_checkpoint(tmp_path / "c.safetensors", w, opt, meta)
    ck = load_checkpoint(tmp_path / "c.safetensors")
    np.testing.assert_array_equal(ck.weights["model.norm.weight"], w["model.norm.weight"])
    np.testing.assert_array_equal(ck.optim["optim.m.model.norm.weight"], np.ones(4))
    assert ck.meta["step"] == 7 and ck.meta["data"] == {"rng": {"state": 123}}


WRITER = r"""
import sys, numpy as np
from orion.train.checkpoint import save_checkpoint
path = sys.argv[1]
big = np.random.default_rng(0).standard_normal(4_000_000).astype(np.float32)
step = 1
print("ready", flush=True)
while True:
    step += 1
    save_checkpoint(path, {"w": big + step}, {}, {"step": step})
"""


@pytest.mark.slow
def test_kill_9_during_writes_leaves_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, {"w": np.zeros(4_000_000, np.float32) + 1}, {}, {"step": 1})
    for delay in (0.05, 0.3, 0.7):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)],
                                stdout=subprocess.PIPE, env=child_env(), cwd=OUTSIDE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ck = load_checkpoint(path)
        step = ck.meta["step"]
        np.testing.assert_array_equal(ck.weights["w"][:3],
                                      (np.random.default_rng(0).standard_normal(3)
                                       .astype(np.float32) + step) if step > 1 else 1.0)
    save_checkpoint(path, {"w": np.zeros(2, np.float32)}, {}, {"step": 0})
    assert not list(tmp_path.glob(".checkpoint.safetensors.tmp-*"))  # stale temp cleaned
