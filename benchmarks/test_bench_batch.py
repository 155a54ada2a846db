"""Batched decode (orion.models.batch) against one stream, on vane, in the same run:
aggregate decode tokens/s of B sequences a token each per eval, for B = 1, 2, 4, 8, 16
and 32, against the model's one-token decode of one sequence. GPT-2 small (124M,
random weights) and the Qwen3-0.6B shape (numpy's random init of the published
config, all 28 layers, bf16). Each ratio is the median of five rounds that time one
stream and then the batch back to back (medians of three moved by a quarter between
runs on a shared 2-core machine). Printed in the figures table, never asserted.

Each round also times a peer's fp32 multiply-adds before and after it (numpy's matmul,
OpenBLAS), so that the table says what the host gave: this machine's cores flip between two clock
states within seconds (numpy's matmul at about 103 and 84 GFMA/s), and the compute-bound
batch and the memory-bound single stream move in opposite directions between them
(docs/performance.md, "What is left").

The per-step cost against B is what picks the default slot count
(`orion.models.batch.DEFAULT_SLOTS`): the columns a step pays for grow nearly free
until the weights stop being the bound.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from orion.models import load_model
from orion.models.batch import BatchDecoder

ROOT = Path(__file__).resolve().parents[1]
STEPS, WARM, ROUNDS = 12, 2, 5
GEMMS = 10   # numpy matmuls a host-rate reading: about 0.1 s
STEADY = 0.05   # host readings this close before and after a round: one speed throughout
PROMPT = 24


def _single_tps(model, logits: np.ndarray) -> tuple[float, np.ndarray]:
    """One sequence's decode tokens/s over STEPS steps, and its last logits."""
    t0 = time.perf_counter()
    for _ in range(STEPS):
        logits = model.decode(int(np.argmax(logits)))
    return STEPS / (time.perf_counter() - t0), logits


def _host_gfma() -> float:
    """The host's fp32 multiply-add rate now, in GFMA/s: numpy's matmul of two 1024 x 1024
    matrices (OpenBLAS on every core). Then a pause, so that OpenBLAS's idle threads stop
    spinning before vane's run."""
    a = np.ones((1024, 1024), np.float32)
    t0 = time.perf_counter()
    for _ in range(GEMMS):
        a @ a
    rate = GEMMS * 1024**3 / (time.perf_counter() - t0) / 1e9
    time.sleep(0.2)
    return rate


def _measure_slots(model, slots: int
                   ) -> tuple[float, float, float, list[tuple[float, float, float]]]:
    """(aggregate tokens/s, ms a step, aggregate / one stream, each round's (host GFMA/s
    before, after, ratio)) with every slot live: medians over ROUNDS rounds, each timing
    one stream's decode then the batch's steps back to back, so that the ratio pairs
    figures of the same seconds (this machine's speed moves by 10% and more within a
    run), between two readings of the host's rate."""
    rng = np.random.default_rng(0)
    single_logits = model.prefill(list(range(1, PROMPT + 1)))
    for _ in range(WARM):
        single_logits = model.decode(int(np.argmax(single_logits)))
    tps, step_ms, rounds = [], [], []
    with BatchDecoder(model, slots=slots, context=256) as batch:
        live = [batch.acquire() for _ in range(slots)]
        logits = {s: batch.start(s, rng.integers(1, 1000, PROMPT).tolist()) for s in live}
        for _ in range(WARM):
            logits = batch.step({s: int(np.argmax(v)) for s, v in logits.items()})
        # untimed: the batch's builds unloaded the one stream's programs (Model._build),
        # and their reload (0.27 s on the 8-layer Qwen3 shape) made round 1 an outlier
        _, single_logits = _single_tps(model, single_logits)
        for _ in range(ROUNDS):
            before = _host_gfma()
            single, single_logits = _single_tps(model, single_logits)
            t0 = time.perf_counter()
            for _ in range(STEPS):
                logits = batch.step({s: int(np.argmax(v)) for s, v in logits.items()})
            spent = time.perf_counter() - t0
            tps.append(slots * STEPS / spent)
            step_ms.append(1e3 * spent / STEPS)
            rounds.append((before, _host_gfma(), tps[-1] / single))
    ratio = statistics.median(r[2] for r in rounds)
    return statistics.median(tps), statistics.median(step_ms), ratio, rounds


def _measure(figures, what: str, model) -> None:
    for slots in (1, 2, 4, 8, 16, 32):
        tps, step_ms, ratio, rounds = _measure_slots(model, slots)
        name = f"{what} batched decode, {slots} streams"
        figures.add(f"{name}: ms a step", step_ms, "ms")
        figures.add(f"{name}: aggregate tok/s", tps, "tok/s")
        figures.add(f"{name}: aggregate tok/s / one stream, median of {ROUNDS} paired rounds"
                    + (" (target 4x)" if slots in (8, 16) else "")
                    + (" (target 0.98x)" if slots == 1 else ""), ratio, "x")
        figures.text(f"{name}: each round's ratio, at the host's GFMA/s before / after",
                     ", ".join(f"{r:.2f}x at {a:.0f}/{b:.0f}" for a, b, r in rounds))
        steady = [r for a, b, r in rounds if abs(a - b) <= STEADY * max(a, b)]
        if steady:   # the rounds the host's speed did not change within
            figures.add(f"{name}: aggregate / one stream, median of the {len(steady)} rounds "
                        f"whose host readings agree within {STEADY:.0%}",
                        statistics.median(steady), "x")


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests"))
    from models.hf_fixtures import PUBLISHED, save_numpy_init

    return save_numpy_init(tmp_path_factory.mktemp("qwen3") / "qwen3", PUBLISHED["Qwen3-0.6B"])


def test_gpt2_small_batched_decode(benchmark, figures, gpt2_dir, threads):
    model = load_model(gpt2_dir, prefill_buckets=(32,), decode_buckets=(256,))
    try:
        benchmark.pedantic(_measure, args=(figures, "gpt2 small", model), rounds=1,
                           iterations=1)
    finally:
        model.close()


def test_qwen3_shape_batched_decode(benchmark, figures, qwen3_dir, threads):
    model = load_model(qwen3_dir, prefill_buckets=(32,), decode_buckets=(256,))
    try:
        benchmark.pedantic(_measure, args=(figures, "Qwen3-0.6B shape", model), rounds=1,
                           iterations=1)
    finally:
        model.close()
