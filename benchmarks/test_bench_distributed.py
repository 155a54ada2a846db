"""Data-parallel training on MLX's ring backend, 2 ranks on this one machine:

- ms/step of `orion train` at 1 rank (batch 4 x grad_accum 2) and at 2 ranks (batch 4
  each): the same global batch, the same weights after each step
- the gradient all-reduce (`DataParallel.sum_grads`: one all_sum per tensor) for
  gradients the size of Stories110M's (110M fp32 = 438 MB) and of a rank-8 LoRA
  adapter on q, k, v, o of the same model (590K = 2.4 MB), in float32 and bfloat16,
  and the same bytes all-summed as one buffer

Both ranks share this machine's cores (2 here, also busy with other work), and the
ring goes through the loopback interface: these figures say what the engine costs on
the CPU, not what two Macs see; docs/distributed.md turns them into a scaling model.
`pytest benchmarks/test_bench_distributed.py --benchmark-enable -s` prints the table.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from asset_paths import require_asset  # noqa: E402  (tests/data ships the corpus)

TIMEOUT_S = 900
STEPS = 12          # the first 2 (compile caches, page faults) are not counted
MODEL = {"dim": 128, "n_layers": 4, "n_heads": 4, "hidden_dim": 384}


def _launcher() -> list[str]:
    pytest.importorskip("mlx.core", reason="needs the distributed extra (mlx)")
    exe = Path(sys.executable).with_name("mlx.launch")
    exe = str(exe) if exe.exists() else shutil.which("mlx.launch")
    if exe is None:
        pytest.skip("mlx.launch is not installed")
    return [exe, "--backend", "ring", "--python", sys.executable]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a session of its own: a timeout kills mlx.launch and the ranks it started
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    assert p.returncode == 0 and "exited with code" not in err, err[-3000:]
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _median_step(out: Path, key: str = "ms") -> float:
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return statistics.median(r[key] for r in recs[2:])


def test_step_time_one_and_two_ranks(benchmark, figures, tmp_path):
    text = require_asset("text/tinyshakespeare_input.txt")
    launch = _launcher()
    base = {"model": MODEL, "vocab_size": 512, "batch_size": 4, "seq_len": 128,
            "steps": STEPS, "warmup": 2, "checkpoint_every": 0, "update": "inputs"}
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps({**base, "grad_accum": 2}))
    two.write_text(json.dumps(base))
    train = ["-m", "orion.cli", "train", "--data", str(text), "--no-progress"]

    def run() -> None:
        _run([sys.executable, *train, "--config", str(one), "--out", str(tmp_path / "o1")])
        _run([*launch, "-n", "2", *train, "--config", str(two), "--out",
              str(tmp_path / "o2")])

    benchmark.pedantic(run, rounds=1, iterations=1)
    ms1, ms2 = _median_step(tmp_path / "o1"), _median_step(tmp_path / "o2")
    figures.add("dp step, 1 rank x grad_accum 2 (dim 128, 4 layers)", ms1, "ms")
    figures.add("dp step, 2 ranks sharing the cores", ms2, "ms")
    figures.add("dp step, 2 ranks: loss+gradient all-reduce", _median_step(
        tmp_path / "o2", "reduce_ms"), "ms")
    figures.ratio("dp 2 ranks vs 1 rank, same global batch", ms1, ms2)


def test_all_reduce_stories110m_and_lora(benchmark, figures):
    launch = _launcher()
    out = {}

    def run() -> None:
        p = _run([*launch, "-n", "2", "benchmarks/allreduce_rank.py"])
        out.update(json.loads(p.stdout.strip().splitlines()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    for name in ("stories110m", "lora_r8"):
        for dtype in ("float32", "bfloat16"):
            mb = out[f"{name}_{dtype}_bytes"] / 1e6
            figures.add(f"all-reduce {name} {dtype} ({mb:.1f} MB), 2 ranks",
                        out[f"{name}_{dtype}_ms"], "ms")
        figures.add(f"all_sum of {name} as one buffer, float32", out[f"{name}_one_buffer_ms"],
                    "ms")
