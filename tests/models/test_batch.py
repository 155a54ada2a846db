"""Batched decode (orion.models.batch): B sequences a token each per eval.

- every row gives the very bits of the logits the model's own one-token decode gives
  the same sequence (vane computes each column of a few-column product as the GEMV of
  that column alone, and a row's attention is decode's), hence the same greedy
  tokens, for GPT-2, a Qwen3 shape (GQA, q/k norms, RoPE) and a Gemma 3 shape
  (sliding windows: two masks), across decode buckets;
- a row's logits are the same bits whether it runs alone or beside others, and
  whether others join or leave mid-way (batch invariance);
- bad slots, prompts too long for a slot and a full slot are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import InvalidArgumentError, StateError
from orion.models.batch import SHORT_PROMPT_ROWS, BatchDecoder

from .conftest import qwen3_shape_slow, random_adapter

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("gpt2_compile_budget")]

STEPS = 40   # with prompts of 5..30 tokens: crosses the 32 and 64 buckets


@pytest.fixture(scope="module")
def model(shape_model):
    """GPT-2, Qwen3 and (slow) Gemma 3 shapes (conftest's `shape_model`)."""
    return shape_model


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, vocab, n).tolist() for n in (5, 17, 30)]


def _alone(model, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and the logits after each, by the model's one-token decode."""
    logits = model.prefill(prompt)
    tokens, seen = [], [logits]
    for _ in range(steps):
        tokens.append(int(np.argmax(logits)))
        logits = model.decode(tokens[-1])
        seen.append(logits)
    return tokens, seen


@qwen3_shape_slow()
def test_rows_match_the_one_token_decode(model):
    prompts = _prompts(model.config.vocab_size)
    expected = [_alone(model, p, STEPS) for p in prompts]
    with BatchDecoder(model, slots=4) as batch:
        slots = [batch.acquire() for _ in prompts]
        logits = {s: batch.start(s, p) for s, p in zip(slots, prompts, strict=True)}
        for step in range(STEPS):
            tokens = {s: int(np.argmax(logits[s])) for s in slots}
            for s, (want, _) in zip(slots, expected, strict=True):
                assert tokens[s] == want[step], f"slot {s}, step {step}"
            logits = batch.step(tokens)
            for s, (_, seen) in zip(slots, expected, strict=True):
                assert np.array_equal(logits[s], seen[step + 1]), f"slot {s}, step {step}"
        assert batch.bucket == 128
        assert [batch.position(s) for s in slots] == [len(p) + STEPS for p in prompts]


def test_a_slot_decoding_alone_is_the_one_token_decode(model):
    """A step of one live slot runs as one C sequence (its new key and value rows
    copied into the slot's cache there): slot 2 of 4, alone after the others left,
    gives the bits of the model's own decode, across a decode bucket."""
    prompt = _prompts(model.config.vocab_size)[2]   # 30 tokens: crosses bucket 32
    tokens, seen = _alone(model, prompt, 8)
    with BatchDecoder(model, slots=4) as batch:
        slots = [batch.acquire() for _ in range(3)]
        logits = {s: batch.start(s, prompt[: 5 + s]) for s in slots[:2]}
        logits[2] = batch.start(2, prompt)
        batch.step({s: 1 for s in slots[:2]})
        for s in slots[:2]:
            batch.release(s)
        assert np.array_equal(logits[2], seen[0])
        for step, t in enumerate(tokens):
            got = batch.step({2: t})[2]
            assert np.array_equal(got, seen[step + 1]), f"step {step}"
        assert batch.position(2) == len(prompt) + len(tokens)


def _run(model, prompts, steps, *, slots=4, join=None, leave=None):
    """Slot 0's logits at every step, with `prompts[1:]` beside it; `join`: step at
    which they start (None: from the first), `leave`: step at which they stop."""
    out = []
    with BatchDecoder(model, slots=slots) as batch:
        mine = batch.acquire()
        logits = {mine: batch.start(mine, prompts[0])}
        others: list[int] = []
        for step in range(steps):
            if step == (join or 0) and not others and len(prompts) > 1:
                for p in prompts[1:]:
                    s = batch.acquire()
                    logits[s] = batch.start(s, p)
                    others.append(s)
            if leave is not None and step == leave:
                for s in others:
                    batch.release(s)
                    logits.pop(s)
                others = []
            logits = batch.step({s: int(np.argmax(v)) for s, v in logits.items()})
            out.append(logits[mine])
    return out


def test_a_row_is_the_same_bits_alone_or_beside_others(model):
    prompts = _prompts(model.config.vocab_size)
    alone = _run(model, prompts[:1], 24)
    for kw in ({}, {"join": 5}, {"join": 3, "leave": 12}):
        beside = _run(model, prompts, 24, **kw)
        for step, (a, b) in enumerate(zip(alone, beside, strict=True)):
            assert np.array_equal(a, b), f"{kw}: step {step} differs"


def test_high_slots_keep_their_bits_after_the_low_ones_leave(model):
    """A step or a batch head computes the columns from its first slot to its last alone
    (`Program.set_live_columns`): slots 2 and 3 of 4, their prompts' heads run as one
    with slots 0 and 1 free, then stepping beside each other, and slot 3 alone after 2
    left, give the bits of the model's own decode."""
    first, second = _prompts(model.config.vocab_size)[:2]
    mine = {2: first, 3: second[:12]}   # short prompts: each one verify, heads deferred
    expected = {s: _alone(model, p, 6) for s, p in mine.items()}
    with BatchDecoder(model, slots=4) as batch:
        batch.plan_short_prompts()
        for s in range(4):
            assert batch.acquire() == s
        batch.start(0, second)
        batch.start(1, first)
        batch.release(0)
        batch.release(1)
        for s, prompt in mine.items():
            run = batch.begin(s, prompt)
            assert batch.advance(run, defer_head=True) is None and run.left == 0
        logits = batch.heads()
        assert sorted(logits) == [2, 3]
        for step in range(6):
            for s in logits:
                assert np.array_equal(logits[s], expected[s][1][step]), f"slot {s}, {step}"
            if step == 3:
                batch.release(2)
                logits.pop(2)
            logits = batch.step({s: expected[s][0][step] for s in logits})


def test_refusals(tiny_gpt2):
    with pytest.raises(InvalidArgumentError, match="slots must be"):
        BatchDecoder(tiny_gpt2, slots=0)
    with pytest.raises(InvalidArgumentError, match="slots must be"):
        BatchDecoder(tiny_gpt2, slots=33)
    with pytest.raises(InvalidArgumentError, match="below the model's smallest"):
        BatchDecoder(tiny_gpt2, slots=2, context=16)
    with BatchDecoder(tiny_gpt2, slots=2, context=32) as batch:
        assert batch.context == 32
        with pytest.raises(StateError, match="not acquired"):
            batch.step({0: 1})
        s = batch.acquire()
        with pytest.raises(InvalidArgumentError, match="leaves no room"):
            batch.start(s, list(range(32)))
        logits = batch.start(s, list(range(30)))
        logits = batch.step({s: int(np.argmax(logits))})
        batch.step({s: int(np.argmax(logits))})
        with pytest.raises(InvalidArgumentError, match="is full"):
            batch.step({s: 1})
        with pytest.raises(InvalidArgumentError, match="slot must be"):
            batch.position(7)
        assert batch.acquire() is not None and batch.acquire() is None


def _chunked(model, prompt, steps, chunk, *, beside=None):
    """Greedy tokens and the logits after each of `prompt` put in by chunks (the first
    `chunk` by prefill, then 32 a chunk by verify), with `beside` (a prompt) decoding
    in another slot between the chunks when given."""
    with BatchDecoder(model, slots=4) as batch:
        other = None
        if beside is not None:
            other = batch.acquire()
            other_logits = batch.start(other, beside)
        mine = batch.acquire()
        run = batch.begin(mine, prompt, chunk=chunk)
        chunks = 0
        while (logits := batch.advance(run)) is None:
            chunks += 1
            if other is not None:   # a step of the other slot between two chunks
                other_logits = batch.step({other: int(np.argmax(other_logits))})[other]
        assert chunks == -(-(len(prompt) - chunk) // 32), "chunks cut elsewhere"
        assert batch.position(mine) == len(prompt)
        tokens, seen = [], [logits]
        for _ in range(steps):
            tokens.append(int(np.argmax(logits)))
            logits = batch.step({mine: tokens[-1]})[mine]
            seen.append(logits)
    return tokens, seen


@qwen3_shape_slow()
def test_a_chunked_prompt_is_its_own_bits_beside_others(model):
    """A 70-token prompt in chunks of 8 + 32 + 30: the same bits with another slot
    stepping between its chunks as alone, and close to one whole prefill's."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, model.config.vocab_size, 70).tolist()
    alone_tokens, alone = _chunked(model, prompt, 12, 8)
    beside_tokens, beside = _chunked(model, prompt, 12, 8, beside=_prompts(
        model.config.vocab_size)[1])
    assert beside_tokens == alone_tokens
    for step, (a, b) in enumerate(zip(alone, beside, strict=True)):
        assert np.array_equal(a, b), f"step {step} differs beside another slot"
    whole = model.prefill(prompt)   # the prompt in one prefill: fp16 rounding apart
    scale = float(np.abs(whole).max())
    assert float(np.abs(alone[0] - whole).max()) <= 0.02 * scale
    # a prompt within the first chunk is one prefill: start's very bits
    with BatchDecoder(model, slots=2) as batch:
        s = batch.acquire()
        run = batch.begin(s, prompt[:30], chunk=64)
        assert np.array_equal(batch.advance(run), model.prefill(prompt[:30]))


def test_a_short_prompt_goes_in_by_one_verify(model):
    """After plan_short_prompts, prompts of up to 16 tokens go in as one verify from
    position 0 (8 or 16 rows), longer ones by prefill: the logits are a prefill's up to
    fp16 rounding, and the slot's steps are the bits of decoding after that verify."""
    vocab = model.config.vocab_size
    rng = np.random.default_rng(5)
    with BatchDecoder(model, slots=2) as batch:
        assert batch.plan_short_prompts() == SHORT_PROMPT_ROWS
        for n in (3, 12, 16, 17):
            prompt = rng.integers(0, vocab, n).tolist()
            calls = model.stats.prefill_calls
            s = batch.acquire()
            logits = batch.start(s, prompt)
            short = model.stats.prefill_calls == calls
            assert short == (n <= 16), f"{n} tokens"
            whole = model.prefill(prompt)
            assert float(np.abs(logits - whole).max()) <= 0.02 * float(np.abs(whole).max())
            if short:   # the model's own decode after the same verify
                model.reset()
                want = [model.verify(prompt)[-1]]
            else:
                want = [whole]
            assert np.array_equal(logits, want[0])
            tokens = []
            for _ in range(6):
                tokens.append(int(np.argmax(want[-1])))
                want.append(model.decode(tokens[-1]))
            for step, t in enumerate(tokens):
                got = batch.step({s: t})[s]
                assert np.array_equal(got, want[step + 1]), f"{n} tokens, step {step}"
            batch.release(s)


def test_prompt_heads_wait_and_run_as_one(tiny_gpt2):
    """advance(defer_head=True) leaves a short prompt's (and a chunked prompt's last
    verify's) hidden state in its slot's head row; heads() gives each the very bits its
    own head gives, in one eval for them all. A prompt that ends in a prefill returns
    its logits as before; a step waits for the heads."""
    model = tiny_gpt2
    vocab = model.config.vocab_size
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, vocab, n).tolist() for n in (3, 12, 40, 20)]
    chunks = [None, None, 8, None]   # 40 tokens: its last 32 by a verify; 20: a prefill
    with BatchDecoder(model, slots=4) as own, BatchDecoder(model, slots=4) as deferred:
        own.plan_short_prompts()
        deferred.plan_short_prompts()
        want, got = {}, {}
        for prompt, chunk in zip(prompts, chunks, strict=True):
            s = own.acquire()
            want[s] = own.start(s, prompt, chunk)
            assert deferred.acquire() == s
            run = deferred.begin(s, prompt, chunk)
            logits = deferred.advance(run, defer_head=True)
            while logits is None and run.left:   # the 40-token prompt's later chunks
                logits = deferred.advance(run, defer_head=True)
            assert (logits is None) == (len(prompt) != 20) and run.left == 0
            if logits is not None:
                got[s] = logits
        assert deferred.waiting_heads == {0, 1, 2}
        with pytest.raises(StateError, match=r"slots \[0, 1, 2\] wait"):
            deferred.step({3: 1})
        got.update(deferred.heads())
        assert deferred.waiting_heads == frozenset() and deferred.heads() == {}
        for s in range(4):
            assert np.array_equal(got[s], want[s]), f"slot {s}"
        tokens = {s: int(np.argmax(want[s])) for s in range(4)}
        after_own, after = own.step(tokens), deferred.step(tokens)
        for s in range(4):
            assert np.array_equal(after[s], after_own[s]), f"slot {s}, step"
        # a slot released while its head waits is dropped from the heads
        deferred.release(0)
        assert deferred.acquire() == 0
        run = deferred.begin(0, prompts[0])
        assert deferred.advance(run, defer_head=True) is None and run.left == 0
        assert deferred.waiting_heads == {0}
        deferred.release(0)
        assert deferred.heads() == {}


def test_chunked_prompt_refusals(tiny_gpt2):
    with BatchDecoder(tiny_gpt2, slots=2, context=128) as batch:
        a, b = batch.acquire(), batch.acquire()
        with pytest.raises(InvalidArgumentError, match="chunk must be"):
            batch.begin(a, list(range(40)), chunk=0)
        with pytest.raises(InvalidArgumentError, match="at least one token"):
            batch.begin(a, [], chunk=8)
        run = batch.begin(a, list(range(1, 60)), chunk=8)
        assert batch.advance(run) is None
        with pytest.raises(StateError, match="one prompt at a time"):
            batch.begin(b, [1, 2, 3])
        batch.release(a)   # dropped half way: its run is over
        with pytest.raises(StateError, match="not the one going in"):
            batch.advance(run)
        logits = batch.start(b, [1, 2, 3])   # the staging cache is free again
        assert logits.shape == (tiny_gpt2.config.vocab_size,)


def _greedy_after(batch, prompt, chunk, steps):
    """A fresh slot's prompt in by chunks, then greedy steps: its logits each time, and
    how many prompt tokens came from a shared prefix."""
    s = batch.acquire()
    run = batch.begin(s, prompt, chunk=chunk)   # start's loop, keeping the run's count
    logits = None
    while logits is None:
        logits = batch.advance(run)
    seen = [logits]
    for _ in range(steps):
        logits = batch.step({s: int(np.argmax(logits))})[s]
        seen.append(logits)
    batch.release(s)
    return seen, run.reused


def test_a_shared_prefix_gives_the_bits_of_running_it(model):
    """Prompt B shares A's first 80 tokens: with A's rows saved (cuts 8, 40, 72, 104)
    B loads the 72 before its cut instead of running them, and every logit is the one
    it gets with nothing saved."""
    rng = np.random.default_rng(5)
    vocab = model.config.vocab_size
    a = rng.integers(0, vocab, 110).tolist()
    b = a[:80] + rng.integers(0, vocab, 30).tolist()
    with BatchDecoder(model, slots=2) as batch:   # nothing shared
        want, reused = _greedy_after(batch, b, 8, 6)
        assert reused == 0
    with BatchDecoder(model, slots=2, prefix_bytes=1 << 24) as batch:
        _greedy_after(batch, a, 8, 2)
        assert len(batch.prefixes) == 1
        got, reused = _greedy_after(batch, b, 8, 6)
        assert reused == 72 and batch.prefixes.tokens_reused == 72
        again, reused = _greedy_after(batch, b, 8, 6)   # its own prefix now: cut 104
        assert reused == 104
    for step, (w, g, h) in enumerate(zip(want, got, again, strict=True)):
        assert np.array_equal(w, g), f"step {step}: the shared prefix changed the bits"
        assert np.array_equal(w, h), f"step {step}: its own saved prefix changed the bits"


def test_shared_prefixes_stay_in_their_memory(tiny_gpt2):
    from orion.models.shared_prefixes import SharedPrefixes, chunk_cuts

    assert chunk_cuts(100, 8, 32) == [8, 40, 72] and chunk_cuts(8, 8, 32) == []
    with pytest.raises(InvalidArgumentError, match="max_bytes"):
        SharedPrefixes(-1)
    rng = np.random.default_rng(6)
    cfg = tiny_gpt2.config
    per_token = cfg.n_layers * 2 * cfg.kv_dim * 2
    with BatchDecoder(tiny_gpt2, slots=2, prefix_bytes=100 * per_token) as batch:
        for _ in range(4):   # each saves 72 tokens' rows: one fits at a time
            _greedy_after(batch, rng.integers(0, cfg.vocab_size, 90).tolist(), 8, 0)
            assert len(batch.prefixes) == 1 and batch.prefixes.bytes == 72 * per_token
    with BatchDecoder(tiny_gpt2, slots=2, prefix_bytes=10 * per_token) as batch:
        _greedy_after(batch, rng.integers(0, cfg.vocab_size, 90).tolist(), 8, 0)
        assert len(batch.prefixes) == 0   # larger than the whole bound: not kept


@qwen3_shape_slow()
def test_rows_with_different_adapters_in_one_batch(model):
    """Three slots in one batch: one with adapter "one" (an attention module, rank 4),
    one with "two" (other modules, rank 8), one with none. Each row's logits are the
    bits of the model's own decode with that adapter selected: every row computes
    with its own adapter's matrices in the same eval."""
    mods = model.arch.linear_modules()
    model.adapters.add(random_adapter(model.arch, (mods[0],), 4, 1), "one")
    model.adapters.add(random_adapter(model.arch, tuple(mods[-2:]), 8, 2), "two")
    prompts = _prompts(model.config.vocab_size)
    names = ["one", "two", None]
    expected = []
    try:
        for p, name in zip(prompts, names, strict=True):
            model.set_adapter(name)
            expected.append(_alone(model, p, 6))
        model.set_adapter(None)
        with BatchDecoder(model, slots=4) as batch:
            slots = [batch.acquire() for _ in prompts]
            logits = {s: batch.start(s, p, adapter=name)
                      for s, p, name in zip(slots, prompts, names, strict=True)}
            for s, (_, seen) in zip(slots, expected, strict=True):
                assert np.array_equal(logits[s], seen[0]), f"slot {s}: prompt logits"
            for step in range(6):
                tokens = {s: int(np.argmax(logits[s])) for s in slots}
                logits = batch.step(tokens)
                for s, name, (_, seen) in zip(slots, names, expected, strict=True):
                    assert np.array_equal(logits[s], seen[step + 1]), \
                        f"slot {s} ({name}), step {step}"
            assert model.active_adapter is None
        # one signature for every mix: the adapters swapped between slots (the same
        # row and cache buckets) compile nothing
        compiled = model.stats.programs_compiled
        with BatchDecoder(model, slots=4) as batch:
            slots = [batch.acquire() for _ in prompts]
            logits = {}
            for s, p, name in zip(slots, prompts, ["two", None, "one"], strict=True):
                logits[s] = batch.start(s, p, adapter=name)
            batch.step({s: int(np.argmax(v)) for s, v in logits.items()})
        assert model.stats.programs_compiled == compiled
    finally:
        model.set_adapter(None)
        for name in ("one", "two"):
            model.adapters.adapters.pop(name, None)
