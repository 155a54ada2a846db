"""Speculative decoding on vane: tokens/s of plain greedy against prompt-lookup
speculation and a draft model, GPT-2 124M's shape, the same greedy tokens asserted.

What the case measures: random weights never copy a passage, so the weights are
tests/models' "peaked" GPT-2 (the next token follows the current one through a fixed
permutation: greedy text is a deterministic chain) and the prompt is P, P's greedy
continuation, then P again; the model's continuation then walks the same chain, which
prompt lookup finds in the prompt. That is the case speculation is for (a model
repeating or quoting its context: code edits, "repeat the passage", retrieval
answers); on free text acceptance is lower and the figures with it. The draft models
are the same weights (the upper bound of acceptance, each draft token a full decode
step) and a 2-layer 256-wide peaked GPT-2 of the same permutation (a small draft that
mostly agrees). Prompt lookup runs as `speculative="prompt"` (verifying drafts while
they pay, `orion.speculative.DraftPolicy`) and, on the Qwen3 shape whose drafts rarely
hold, also verifying every draft. Figures are printed, never asserted; the greedy
tokens are.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from copying_task import copying_prompt, tokens  # noqa: E402
from models.conftest import SMALL, TINY, save_peaked_gpt2  # noqa: E402
from models.hf_fixtures import PUBLISHED, save_numpy_init  # noqa: E402

from orion.speculative import PromptLookup  # noqa: E402

RUNS = 3          # the median of these
NEW_TOKENS = 96
BUCKETS = {"prefill_buckets": (32, 128), "decode_buckets": (256,)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("torch", reason="the peaked GPT-2 is saved with transformers")
    root = tmp_path_factory.mktemp("spec")
    return save_peaked_gpt2(root / "small", SMALL), save_peaked_gpt2(root / "tiny", TINY)


def run(model, prompt, max_tokens=NEW_TOKENS, **options):
    return tokens(model, prompt, max_tokens=max_tokens, **options)


def gpt2_copying_prompt(target) -> list[int]:
    """P (16 tokens), P's first 48 greedy tokens, then P again: 80 tokens."""
    return copying_prompt(target, seed=0, length=16, copied=48, high=50257)


def test_speculative_decode_gpt2_small(folders, threads, figures, progress):
    from orion.models import load_model

    small_dir, tiny_dir = folders
    target = load_model(small_dir, **BUCKETS)
    self_draft = load_model(small_dir, **BUCKETS)
    tiny = load_model(tiny_dir, **BUCKETS)
    try:
        prompt = gpt2_copying_prompt(target)
        cases = {"plain greedy": {},
                 "prompt lookup, 7 drafts": {"speculative": "prompt"},
                 "prompt lookup, 15 drafts": {"speculative": "prompt", "draft_tokens": 15},
                 "draft model GPT-2 2x256, 7 drafts": {"speculative": tiny},
                 "draft model itself, 7 drafts": {"speculative": self_draft}}
        plain = None
        for name, options in cases.items():
            run(target, prompt, **options)                           # compiles
            tps, stats = [], None
            for r in range(RUNS):
                out, stats = run(target, prompt, **options)
                if plain is None:
                    plain = out
                assert out == plain, name                            # the same tokens
                tps.append(stats.decode_tokens_per_s)
                progress(f"{name}: run {r + 1}/{RUNS}")
            figures.add(f"gpt2 small speculative: {name}, decode tok/s",
                        statistics.median(tps), "tok/s")
            s = stats.speculation
            if s is not None:
                figures.add(f"gpt2 small speculative: {name}, acceptance", s.acceptance, "")
                figures.add(f"gpt2 small speculative: {name}, tokens an eval",
                            s.tokens_per_step, "tok")
        # one verify eval of 8 rows against one decode step, at the same position
        import time

        ms = {}
        for what in ("decode", "verify8", "verify16"):
            times = []
            for _ in range(9):
                target.prefill(prompt)
                t = time.perf_counter()
                if what == "decode":
                    target.decode(1)
                else:
                    target.verify(list(range(1, 1 + int(what[6:]))))
                times.append(time.perf_counter() - t)
            ms[what] = 1e3 * statistics.median(times)
            figures.add(f"gpt2 small: one {what} eval, ms", ms[what], "ms")
    finally:
        for m in (target, self_draft, tiny):
            m.close()


def test_speculative_decode_in_a_batch_slot(folders, threads, figures, progress):
    """The same copying task as one request of a batching server (`BatchScheduler`, 8
    slots, in process), the other slots empty: its plain steps are batch steps of one
    row, and with prompt lookup it verifies its drafts in its slot (the slot's rows
    into the model's cache, one verify eval, the new rows back)."""
    from orion.models import load_model
    from orion.serve.batching import BatchScheduler

    small_dir, _ = folders
    target = load_model(small_dir, **BUCKETS)
    try:
        prompt = gpt2_copying_prompt(target)
        plain = run(target, prompt)[0]
        scheduler = BatchScheduler(target, slots=8, verify_rows=8)
        scheduler.start()
        try:
            tps = {}
            for name, options in {"plain greedy": {},
                                  "prompt lookup, 7 drafts": {"speculative": "prompt"}}.items():
                got = []
                for r in range(RUNS + 1):                             # the first warms
                    lm = scheduler.slot_lm()
                    try:
                        out, stats = run(lm, prompt, **options)
                    finally:
                        lm.release()
                    assert out == plain, name
                    got.append(stats.decode_tokens_per_s)
                    progress(f"batch slot, {name}: run {r + 1}/{RUNS + 1}")
                tps[name] = statistics.median(got[1:])
                figures.add(f"gpt2 small in a batch slot: {name}, decode tok/s", tps[name],
                            "tok/s")
            figures.ratio("gpt2 small in a batch slot: prompt lookup / plain",
                          tps["prompt lookup, 7 drafts"], tps["plain greedy"])
        finally:
            scheduler.stop()
    finally:
        target.close()


def test_speculative_decode_qwen3_shape(tmp_path, threads, figures, progress):
    """Qwen3-0.6B's published shape (28 layers in 2 programs, 151,936 rows), numpy's
    random init: nothing makes its greedy text copy the prompt, so P + continuation +
    P measures what acceptance random weights give (one run each: a token costs
    ~0.2 s here). Its logits are nearly flat: greedy text meets near-ties (top two
    within a few fp16 ulps) that the verify rows' rounding may break the other way,
    so the tokens are asserted equal up to the first near-tie of plain decoding."""
    from orion.models import load_model

    folder = save_numpy_init(tmp_path / "qwen3", PUBLISHED["Qwen3-0.6B"])
    model = load_model(folder, **BUCKETS)
    try:
        model.tokenizer = _Ids()
        prompt = copying_prompt(model, seed=0, length=16, copied=32, high=151_000)
        tie = first_near_tie(model, prompt, QWEN3_TOKENS)
        plain = None
        cases = {"plain greedy": {},
                 "prompt lookup, 15 drafts": {"speculative": "prompt", "draft_tokens": 15},
                 "prompt lookup, 15 drafts, every draft verified": {
                     "speculative": PromptLookup(adaptive=False), "draft_tokens": 15}}
        for name, options in cases.items():
            run(model, prompt, max_tokens=4, **options)              # compiles
            out, stats = run(model, prompt, max_tokens=QWEN3_TOKENS, **options)
            plain = out if plain is None else plain
            same = next((i for i, (a, b) in enumerate(zip(out, plain, strict=True))
                         if a != b), len(out))
            assert same >= min(tie, len(out)), name
            progress(name)
            figures.add(f"qwen3-0.6B shape speculative: {name}, decode tok/s",
                        stats.decode_tokens_per_s, "tok/s")
            figures.add(f"qwen3-0.6B shape speculative: {name}, tokens equal to plain "
                        f"(first near-tie at {tie})", same, "tok")
            s = stats.speculation
            if s is not None:
                figures.add(f"qwen3-0.6B shape speculative: {name}, acceptance",
                            s.acceptance, "")
                figures.add(f"qwen3-0.6B shape speculative: {name}, tokens an eval",
                            s.tokens_per_step, "tok")
    finally:
        model.close()


QWEN3_TOKENS = 48
NEAR_TIE_ULPS = 8


def first_near_tie(model, prompt, n) -> int:
    """The index of the first greedy token whose top two logits are within
    NEAR_TIE_ULPS fp16 ulps of the largest (n: none)."""
    logits = model.prefill(prompt)
    for i in range(n):
        top = np.sort(logits)[-2:]
        ulp = 2.0 ** (np.floor(np.log2(np.abs(logits).max())) - 10)
        if top[1] - top[0] <= NEAR_TIE_ULPS * ulp:
            return i
        logits = model.decode(int(np.argmax(logits)))
    return n


class _Ids:
    """A stand-in tokenizer (the numpy folder has none): ids as text, no end token."""

    vocab_size = 151_936
    eos_token_id = None
    eos_token_ids = ()
    bytes_concatenate = False

    def decode(self, ids):
        return " ".join(str(i) for i in ids)
