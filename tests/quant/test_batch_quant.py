"""Batched decode over a 4-bit model (mlx-lm's own 4-bit folder of a Qwen3 shape):
every row gives the very bits of the model's one-token decode of that sequence, alone
or beside others joining and leaving. On every vane ISA the fused 4-bit GEMV sums a
row as the dense one-column GEMV sums the decoded row, and a few columns run that GEMV
on decoded rows (vk_qmat_columns_alone; tests/c/test_qkernels.c checks the kernels).
CI runs it on AVX-512; ORION_VANE_ISA=avx2 (or scalar) runs it on those paths."""

from __future__ import annotations

import numpy as np
import pytest

from orion.models import load_model
from orion.models.batch import BatchDecoder

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def model(qwen3_mlx4):
    m = load_model(qwen3_mlx4, prefill_buckets=(32,), decode_buckets=(64,))
    yield m
    m.close()


def _alone(model, prompt, steps):
    logits = model.prefill(prompt)
    seen = [logits]
    for _ in range(steps):
        logits = model.decode(int(np.argmax(logits)))
        seen.append(logits)
    return seen


def test_quantized_rows_are_the_one_token_decode_beside_others(model):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 500, n).tolist() for n in (4, 9, 13, 6, 20)]
    steps = 12
    expected = [_alone(model, p, steps) for p in prompts]
    with BatchDecoder(model, slots=8) as batch:
        slots = [batch.acquire() for _ in prompts]
        logits = {s: batch.start(s, p) for s, p in zip(slots[:1], prompts[:1], strict=True)}
        for step in range(steps):
            if step == 3:      # four more join: buckets of 1, then 8 rows
                for s, p in zip(slots[1:], prompts[1:], strict=True):
                    logits[s] = batch.start(s, p)
            if step == 3 + 1:  # and one leaves
                batch.release(slots[2])
                logits.pop(slots[2])
            tokens = {s: int(np.argmax(v)) for s, v in logits.items()}
            logits = batch.step(tokens)
            for s, got in logits.items():
                i = slots.index(s)
                at = step + 1 if i == 0 else step - 2
                assert np.array_equal(got, expected[i][at]), f"slot {s}, step {step}"
