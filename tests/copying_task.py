"""Speculative decoding's test task, shared by the speculation tests: the tiny "peaked"
GPT-2 (its greedy text is a fixed chain, so a prompt can hold what the output will
copy), a prompt whose continuation repeats it, and greedy tokens by `stream_generate`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 2048


def save_peaked_tiny_gpt2(folder: Path) -> Path:
    from models.conftest import TINY, save_peaked_gpt2

    return save_peaked_gpt2(folder, dict(TINY, vocab_size=VOCAB))


def tokens(model, prompt, **options):
    """The generated tokens (no stop at end-of-text) and the last response's stats."""
    from orion.generate import stream_generate

    out = list(stream_generate(model, prompt, stop_at_eos=False, **options))
    return [r.token for r in out if r.token is not None], out[-1].stats


def copying_prompt(model, seed=1, length=10, copied=24, high=VOCAB):
    """A prompt whose greedy continuation repeats text in it: P (`length` random ids
    below `high`), P's first `copied` greedy tokens, then P again (the peaked GPT-2's
    next token follows its current one, so the continuation comes back)."""
    start = [int(i) for i in np.random.default_rng(seed).integers(0, high, length)]
    return start + tokens(model, start, max_tokens=copied)[0] + start
