"""orion.models.prefix_cache: which prompts reuse the cache, and that reusing it gives
the logits a fresh prefill gives (the shipped Llama on the backend)."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion.generate import generate, stream_generate
from orion.models import default_model_path
from orion.models.prefix_cache import PrefixCachedLM


class CountingLM:
    """Records every call; logits are a function of the whole history, so a wrong
    cache shows as wrong logits."""

    def __init__(self):
        self.config, self.tokenizer, self.calls, self.ids = None, None, [], []
        from orion.models.base import ModelStats

        self.stats = ModelStats()

    position = property(lambda self: len(self.ids))
    max_length = property(lambda self: 64)
    prefill_buckets = property(lambda self: (64,))
    backend = property(lambda self: "test")

    def _logits(self):
        out = np.zeros(8, np.float32)
        out[sum(self.ids) % 8] = 1.0
        return out

    def prefill(self, ids, *, all_logits=False):
        self.calls.append(("prefill", len(ids)))
        self.ids = list(ids)
        return self._logits()

    def decode(self, token):
        self.calls.append(("decode", token))
        self.ids.append(token)
        return self._logits()

    def reset(self):
        self.ids = []

    def truncate(self, n):
        self.calls.append(("truncate", n))
        del self.ids[n:]

    def close(self):
        pass


def test_extends_reuses_diverges_prefills():
    inner = CountingLM()
    lm = PrefixCachedLM(inner, max_extend=3, policy="always")
    lm.prefill([1, 2, 3])
    assert lm.last_cached_tokens == 0
    lm.decode(4)
    out = lm.prefill([1, 2, 3, 4, 5, 6])              # extends: two decodes
    assert lm.last_cached_tokens == 4 and inner.calls[-2:] == [("decode", 5), ("decode", 6)]
    assert inner.ids == [1, 2, 3, 4, 5, 6] and out.argmax() == 21 % 8
    calls = len(inner.calls)
    again = lm.prefill([1, 2, 3, 4, 5, 6])            # the same prompt: no device work
    assert len(inner.calls) == calls and np.array_equal(again, out)
    lm.prefill([1, 2, 9])                              # diverges: cut back to the prefix
    assert inner.calls[-2:] == [("truncate", 2), ("decode", 9)]
    assert lm.last_cached_tokens == 2
    lm.prefill([5, 2, 9])                              # nothing shared: a fresh prefill
    assert inner.calls[-1] == ("prefill", 3) and lm.last_cached_tokens == 0
    lm.prefill([5, 2, 9, 1, 1, 1, 1])                  # 4 extra > max_extend: prefill
    assert inner.calls[-1] == ("prefill", 7)
    inner.reset()                                      # the cache went behind our back
    lm.prefill([5, 2, 9, 1, 1, 1, 1, 2])
    assert inner.calls[-1] == ("prefill", 8)
    off = PrefixCachedLM(CountingLM(), policy="off")
    off.prefill([1])
    off.prefill([1, 2])
    assert off.model.calls == [("prefill", 1), ("prefill", 2)]


def test_failed_decode_forgets_the_cache():
    inner = CountingLM()
    lm = PrefixCachedLM(inner)
    lm.prefill([1, 2])

    def boom(token):
        raise ValueError("device failed")

    inner.decode = boom
    with pytest.raises(ValueError):
        lm.prefill([1, 2, 3])
    assert lm.cached_prefix([1, 2, 3]) == 0


@pytest.mark.slow
def test_cached_turn_matches_fresh_prefill():
    """The next chat turn through the cache gives the same text as a fresh model."""
    model, tok = orion.load(default_model_path())
    try:
        lm = PrefixCachedLM(model, policy="always")
        first = tok.encode("ROMEO:\nWhat light")
        answer = [r.token for r in stream_generate(lm, first, max_tokens=8) if r.token is not None]
        follow = first + answer + tok.encode("\n\nJULIET:\n")
        fed = lm.model.position
        cached = generate(lm, follow, max_tokens=12)
        assert lm.last_cached_tokens == fed > 0
        lm.reset()
        fresh = generate(lm, follow, max_tokens=12)
        assert lm.last_cached_tokens == 0
        assert cached == fresh
    finally:
        model.close()


def test_truncate_lets_a_shared_prefix_be_reused():
    inner = CountingLM()
    lm = PrefixCachedLM(inner, policy="always")
    lm.prefill([1, 2, 3, 4])
    out = lm.prefill([1, 2, 7, 8])
    assert inner.calls[-3:] == [("truncate", 2), ("decode", 7), ("decode", 8)]
    assert lm.last_cached_tokens == 2 and out.argmax() == 18 % 8
    lm.prefill([1, 2])               # a prefix of the cache: keep 1, feed 1
    assert inner.calls[-2:] == [("truncate", 1), ("decode", 2)] and inner.ids == [1, 2]
    lm.prefill([5, 2])
    assert inner.calls[-1] == ("prefill", 2)


def test_auto_extends_only_when_decode_is_cheaper():
    inner = CountingLM()
    lm = PrefixCachedLM(inner)                 # auto
    lm.prefill([1, 2])
    inner.stats.prefill_tokens, inner.stats.prefill_ms = 10, 20.0  # 2 ms a token
    inner.stats.decode_calls, inner.stats.decode_ms = 10, 30.0   # 3 ms a step
    assert lm.cached_prefix([1, 2, 3, 4, 5]) == 2                # 9 ms < 5 tokens: 10 ms
    assert lm.cached_prefix([1, 2] + [3] * 4) == 0               # 12 ms > 6 tokens: 12 ms
    assert lm.cached_prefix([1, 2]) == 2                         # nothing to feed: free
    with pytest.raises(ValueError):
        PrefixCachedLM(inner, policy="sometimes")


@pytest.mark.slow
def test_a_llama_model_reuses_a_shared_prefix():
    """A Llama-family model cuts its cache back to the shared prefix (truncate) and feeds
    only the rest: the shipped model, a prompt that diverges from the cache after 6
    tokens, gives the logits a fresh prefill gives (decode and prefill round alike to
    fp16 tolerance)."""
    model, tok = orion.load(default_model_path())
    try:
        lm = PrefixCachedLM(model, policy="always")
        ids = tok.encode("ROMEO:\nWhat light through yonder")
        lm.prefill(ids)
        other = ids[:6] + tok.encode(" window breaks")
        via_cache = lm.prefill(other)
        assert lm.last_cached_tokens == 6
        assert model.position == len(other)
        fresh = model.prefill(other)
        np.testing.assert_allclose(via_cache, fresh, atol=2e-2 * float(np.abs(fresh).max()))
    finally:
        model.close()
