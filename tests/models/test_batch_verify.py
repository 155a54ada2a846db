"""Speculative decoding in a batch slot (`BatchDecoder.verify`, `truncate`): a slot's
verify gives the bits of the model's own verify of the same sequence, the rows it
keeps are those a lone model keeps (its next steps give decode's bits), the other
slots' rows are untouched by it, and a verify that cannot run is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import InvalidArgumentError, StateError
from orion.models.batch import BatchDecoder

from .conftest import load_shape, qwen3_shape_slow

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("gpt2_compile_budget")]

KEEP = 2     # of the 5 drafts, the verify keeps 2
AFTER = 6    # steps after it


@pytest.fixture(scope="module", params=["gpt2", "Qwen3-0.6B"])
def model(request, tiny_gpt2_dir, tmp_path_factory):
    m = load_shape(request.param, tiny_gpt2_dir, tmp_path_factory)
    yield m
    m.close()


def _prompts(vocab: int) -> tuple[list[int], list[int], list[int]]:
    rng = np.random.default_rng(3)
    return (rng.integers(0, vocab, 27).tolist(), rng.integers(0, vocab, 9).tolist(),
            rng.integers(0, vocab, 5).tolist())


def _alone(model, prompt, drafts, beside_steps):
    """The model on its own: the verify rows of argmax + drafts after `prompt`, then
    the logits of `beside_steps` greedy decode steps after keeping KEEP drafts."""
    first = int(np.argmax(model.prefill(prompt)))
    rows = model.verify([first, *drafts])
    model.truncate(len(prompt) + 1 + KEEP)
    logits, seen = rows[KEEP], []
    for _ in range(beside_steps):
        logits = model.decode(int(np.argmax(logits)))
        seen.append(logits)
    return first, rows, seen


def _plain(model, prompt, steps):
    logits, seen = model.prefill(prompt), []
    for _ in range(steps):
        logits = model.decode(int(np.argmax(logits)))
        seen.append(logits)
    return seen


@qwen3_shape_slow("model")
def test_a_slots_verify_is_the_models_own(model):
    mine, other, drafts = _prompts(model.config.vocab_size)
    first, rows, after = _alone(model, mine, drafts, AFTER)
    beside = _plain(model, other, AFTER + 1)
    with BatchDecoder(model, slots=4) as batch:
        a, b = batch.acquire(), batch.acquire()
        batch.start(a, mine)
        logits_b = batch.start(b, other)
        # b steps once alone, then a verifies (its rows pass bucket 32)
        logits_b = batch.step({b: int(np.argmax(logits_b))})[b]
        assert np.array_equal(logits_b, beside[0])
        got = batch.verify(a, [first, *drafts])
        assert np.array_equal(got, rows)
        assert batch.position(a) == len(mine) + 1 + len(drafts) and batch.bucket == 64
        batch.truncate(a, len(mine) + 1 + KEEP)
        assert batch.position(a) == len(mine) + 1 + KEEP
        logits = {a: got[KEEP], b: logits_b}
        for step in range(AFTER):
            logits = batch.step({s: int(np.argmax(v)) for s, v in logits.items()})
            assert np.array_equal(logits[a], after[step]), f"step {step}"
            assert np.array_equal(logits[b], beside[step + 1]), f"step {step}"


def test_a_truncated_slot_leaves_zeros_past_its_position(tiny_gpt2):
    mine, _, drafts = _prompts(tiny_gpt2.config.vocab_size)
    with BatchDecoder(tiny_gpt2, slots=2) as batch:
        a = batch.acquire()
        first = int(np.argmax(batch.start(a, mine)))
        batch.verify(a, [first, *drafts])
        batch.truncate(a, len(mine))
        for head in batch._heads:
            assert not head[a, :, len(mine):].any()
            assert head[a, :, : len(mine)].any()


def test_verify_refusals(tiny_gpt2):
    mine, other, drafts = _prompts(tiny_gpt2.config.vocab_size)
    with BatchDecoder(tiny_gpt2, slots=2, context=64) as batch:
        a, b = batch.acquire(), batch.acquire()
        with pytest.raises(StateError, match="no prompt"):
            batch.verify(a, drafts)
        first = int(np.argmax(batch.start(a, mine)))
        with pytest.raises(InvalidArgumentError, match="do not fit slot 0's 64 positions"):
            batch.verify(a, [first] * (64 - len(mine) + 1))
        with pytest.raises(InvalidArgumentError, match="cannot keep 28 of slot 0's 27"):
            batch.truncate(a, len(mine) + 1)
        run = batch.begin(b, other * 4, chunk=8)   # goes in through the model's cache
        with pytest.raises(StateError, match="slot 1's prompt is going in"):
            batch.verify(a, [first, *drafts])
        logits = None
        while logits is None:   # the rest of b's prompt, chunk by chunk
            logits = batch.advance(run)
        assert batch.verify(a, [first, *drafts]).shape == (1 + len(drafts),
                                                           tiny_gpt2.config.vocab_size)
