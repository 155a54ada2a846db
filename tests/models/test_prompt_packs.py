"""Prompt packs (orion.models.batch, `BatchDecoder.pack`): several short prompts from
position 0 in one eval, each in a group of rows of its own.

- a prompt gives the same bits whichever group it takes and whatever the others in
  its pack hold: its logits (from the batch head) and its slot's steps after them;
- its logits are a prefill's up to fp16 rounding;
- packs of mixed sizes, too many prompts, ids outside the vocabulary and prompts no
  pack holds are refused by name, before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import InvalidArgumentError, StateError
from orion.models.batch import PACK_COLUMNS, PACK_ROWS, BatchDecoder

from .conftest import qwen3_shape_slow

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("gpt2_compile_budget")]

STEPS = 4


def _packed(batch: BatchDecoder, prompts: dict[int, list[int]], steps: int
            ) -> dict[int, list[np.ndarray]]:
    """Each slot's logits after its prompt (one pack), then after each greedy step."""
    batch.pack(prompts)
    out = batch.heads()
    seen = {s: [out[s]] for s in prompts}
    for _ in range(steps):
        out = batch.step({s: int(np.argmax(v[-1])) for s, v in seen.items()})
        for s in prompts:
            seen[s].append(out[s])
    return seen


@qwen3_shape_slow()
def test_a_prompt_is_its_own_bits_in_any_group(shape_model):
    model = shape_model
    vocab = model.config.vocab_size
    rng = np.random.default_rng(11)
    for fewest, rows in zip((0, *PACK_ROWS), PACK_ROWS, strict=False):
        lo = fewest + 1   # the shortest prompt these rows hold
        lengths = [rows - 1, lo, rows, (lo + rows) // 2][: PACK_COLUMNS // rows]
        prompts = [rng.integers(0, vocab, n).tolist() for n in lengths]
        with BatchDecoder(model, slots=len(prompts)) as alone, \
                BatchDecoder(model, slots=len(prompts)) as together:
            assert alone.plan_packs() == PACK_ROWS == together.plan_packs()
            want = {}
            for p in prompts:   # each alone, in group 0 of slot 0
                s = alone.acquire()
                assert s == 0
                want[id(p)] = _packed(alone, {s: p}, STEPS)[s]
                alone.release(s)
            slots = [together.acquire() for _ in prompts]
            # the last prompt in group 0, the first in the last group
            got = _packed(together, dict(zip(slots, prompts[::-1], strict=True)), STEPS)
            for s, p in zip(slots, prompts[::-1], strict=True):
                for step, (g, w) in enumerate(zip(got[s], want[id(p)], strict=True)):
                    assert np.array_equal(g, w), f"{rows} rows, {len(p)} tokens, step {step}"
                whole = model.prefill(p)
                scale = float(np.abs(whole).max())
                assert float(np.abs(got[s][0] - whole).max()) <= 0.02 * scale


def test_pack_refusals(tiny_gpt2):
    vocab = tiny_gpt2.config.vocab_size
    with BatchDecoder(tiny_gpt2, slots=PACK_COLUMNS) as batch:
        a = batch.acquire()
        with pytest.raises(InvalidArgumentError, match="same rows of \\[\\]"):
            batch.pack({a: [1, 2]})   # no pack planned
        assert batch.plan_packs() == PACK_ROWS
        assert [batch.pack_rows_for(n) for n in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 0]
        b = batch.acquire()
        with pytest.raises(InvalidArgumentError, match=r"same rows .* got \[3, 6\] tokens"):
            batch.pack({a: [1, 2, 3], b: [1, 2, 3, 4, 5, 6]})
        with pytest.raises(InvalidArgumentError, match=r"got \[9\] tokens"):
            batch.pack({a: list(range(9))})
        with pytest.raises(InvalidArgumentError, match=r"got \[0\] tokens"):
            batch.pack({a: []})
        with pytest.raises(InvalidArgumentError, match=f"slot {b}'s prompt has token ids"):
            batch.pack({a: [1, 2], b: [1, vocab]})
        many = {batch.acquire(): [1] for _ in range(PACK_COLUMNS // 4 + 1)}
        with pytest.raises(InvalidArgumentError, match="holds 8 prompts, got 9"):
            batch.pack(many)
        assert not batch.waiting_heads and batch.positions[a] == 0   # nothing ran
        with pytest.raises(StateError, match="not acquired"):
            batch.pack({PACK_COLUMNS - 1: [1]})
        batch.pack({a: [5, 6, 7]})
        assert batch.waiting_heads == {a} and batch.positions[a] == 3


def test_a_pack_that_fails_leaves_its_slots_empty(tiny_gpt2, monkeypatch):
    """A pack that fails after its rows went into the slots (here: right after) leaves
    no rows in them and no heads waiting; the same prompts then go in as if it never
    ran."""
    with BatchDecoder(tiny_gpt2, slots=2) as batch:
        batch.plan_packs()
        a, b = batch.acquire(), batch.acquire()
        prompts = {a: [3, 4, 5], b: [6]}
        batch.pack(prompts)
        want = batch.heads()
        batch.release(a)
        batch.release(b)
        assert (batch.acquire(), batch.acquire()) == (a, b)
        keep = batch._keep_pack_rows

        def failing(*args, **kwargs):
            keep(*args, **kwargs)
            assert any(head[[a, b]].any() for head in batch._heads)
            raise RuntimeError("the device went away")

        monkeypatch.setattr(batch, "_keep_pack_rows", failing)
        with pytest.raises(RuntimeError, match="went away"):
            batch.pack(prompts)
        monkeypatch.setattr(batch, "_keep_pack_rows", keep)
        assert batch.positions[a] == batch.positions[b] == 0 and not batch.waiting_heads
        assert all(not head[[a, b]].any() for head in batch._heads)
        batch.pack(prompts)
        got = batch.heads()
        assert all(np.array_equal(got[s], want[s]) for s in prompts)
