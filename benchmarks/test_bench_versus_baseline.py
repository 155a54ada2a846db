"""Orion against another version of itself, in one run: decode tok/s and prefill ms of
GPT-2 small and the Qwen3-0.6B shape (all 28 layers), this checkout and the one
ORION_BASELINE names (built: its build/liborion.so), each in a process of its own
with the rounds interleaved (`decode_peers.py` says why). The ratios are after / before
(a refactor's target: >= 0.98). Figures are printed, never asserted.

    git worktree add ../before <commit> && cmake -S ../before -B ../before/build && \\
        cmake --build ../before/build
    ORION_BASELINE=../before pytest benchmarks/test_bench_versus_baseline.py -o addopts="" -s
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS
from decode_peers import PeerProcess, interleaved_rounds
from test_bench_gpt2 import DECODE_TOKENS, PROMPT_DECODE, PROMPT_PREFILL, prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models.hf_fixtures import PUBLISHED, save_numpy_init  # noqa: E402

if not os.environ.get("ORION_BASELINE"):
    pytest.skip("set ORION_BASELINE to a built Orion checkout to compare against; runs "
                "wherever one is named", allow_module_level=True)

ROUNDS = 5
SETTLE_S = 1.0
QWEN3_DECODE_TOKENS = 64


def compare(figures, label: str, folder: Path, make_prompt, decode_tokens: int) -> None:
    peers = {k: PeerProcess(k, folder, THREADS, PROMPT_PREFILL)
             for k in ("orion", "orion-baseline")}
    try:
        ids = make_prompt(PROMPT_PREFILL)
        same = np.array_equal(peers["orion"].call("logits", ids),
                              peers["orion-baseline"].call("logits", ids))
        figures.add(f"{label} prefill logits bit-identical to the baseline", float(same), "")
        tps, ms = interleaved_rounds(peers, make_prompt, PROMPT_PREFILL, PROMPT_DECODE,
                                     decode_tokens, ROUNDS, SETTLE_S, label)
    finally:
        for peer in peers.values():
            peer.close()
    for kind, name in (("orion", "this checkout"), ("orion-baseline", "baseline")):
        figures.add(f"{label} decode, {name} (best of {ROUNDS})", tps[kind], "tok/s")
        figures.add(f"{label} prefill {PROMPT_PREFILL}, {name} (median)", ms[kind], "ms")
    figures.ratio(f"{label} decode tok/s, this / baseline (target >= 0.98)", tps["orion"],
                  tps["orion-baseline"])
    figures.ratio(f"{label} prefill speed, this / baseline (target >= 0.98)",
                  ms["orion-baseline"], ms["orion"])


def test_gpt2_small_versus_baseline(gpt2_dir, figures):
    compare(figures, "gpt2", gpt2_dir, prompt, DECODE_TOKENS)


def test_qwen3_shape_versus_baseline(figures, tmp_path):
    config = PUBLISHED["Qwen3-0.6B"]
    folder = save_numpy_init(tmp_path / "qwen3-0.6b", config)

    def qwen3_prompt(n: int) -> list[int]:
        return [int(i) for i in np.random.default_rng(n).integers(0, config["vocab_size"], n)]

    compare(figures, "qwen3", folder, qwen3_prompt, QWEN3_DECODE_TOKENS)
