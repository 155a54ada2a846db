"""Prompt-prefix caching over any `CausalLM` (orion.models.base): a prompt whose ids
extend the ids already in the model's KV cache feeds only the extra tokens, with
`decode`, instead of a fresh `prefill`. Chat turns are the usual case: turn two's
prompt is turn one's prompt, its answer, and the new message.

    cached = PrefixCachedLM(model)
    for piece in stream_generate(cached, ids): ...   # any caller of the protocol
    cached.last_cached_tokens                          # prompt tokens the cache served

The wrapper records every id it sends to the model, so it knows exactly what the
cache holds; anything it cannot prove (a prompt that diverges, a cache the model no
longer holds) is a full prefill. A prompt that shares only a prefix with the cache
reuses that prefix (`truncate(n)` keeps the first n cached tokens): the usual case when
a chat client sends back the previous answer as text whose tokens differ from the ones
generated.

Feeding k tokens by decode costs k decode steps, which is not always cheaper than
one prefill (a model whose decode re-runs the prefix, like Orion's Llama before its
KV-cache decode, pays more). `policy` says when to reuse:

    "auto"    (default) when k decode steps cost less than prefilling the prompt, by
              the model's own running `stats` (decode_ms per step, prefill_ms per
              prefilled token), and k <= max_extend
    "always"  whenever k <= max_extend
    "off"     never: every prompt is a fresh prefill
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError
from orion.models.base import CausalLM, ModelStats
from orion.tokenizers.base import Tokenizer

POLICIES = ("auto", "always", "off")


class PrefixCachedLM:
    """A CausalLM that forwards to `model`, reusing its cache across prompts."""

    def __init__(self, model: CausalLM, *, max_extend: int = 64, policy: str = "auto") -> None:
        if policy not in POLICIES:
            raise InvalidArgumentError(f"prompt cache policy must be one of {POLICIES}, got "
                                       f"{policy!r}")
        self.model = model
        self.max_extend = max_extend
        self.policy = policy
        self._ids: list[int] = []             # what the model's cache holds, in order
        self._logits: np.ndarray | None = None  # the logits after the last of _ids
        self._verified: tuple[int, np.ndarray] | None = None   # the last verify's rows
        self.last_cached_tokens = 0            # prompt tokens the last prefill reused

    # ---- the protocol, forwarded ----------------------------------------------------

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    @property
    def stats(self) -> ModelStats:
        return self.model.stats

    @property
    def position(self) -> int:
        return self.model.position

    @property
    def max_length(self) -> int:
        return self.model.max_length

    @property
    def prefill_buckets(self) -> tuple[int, ...]:
        return self.model.prefill_buckets

    @property
    def backend(self) -> str:
        return self.model.backend

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """How many of `ids` a prefill now would take from the cache."""
        n = len(self._ids)
        if self.policy == "off" or n == 0 or self._logits is None or self.model.position != n:
            return 0
        common = 0
        for a, b in zip(self._ids, ids, strict=False):
            if a != b:
                break
            common += 1
        if common < n:   # reusing part of the cache: the model cuts it back
            common = min(common, len(ids) - 1)   # one token to feed, for the logits
        extra = len(ids) - common
        if common == 0 or extra > self.max_extend or not self._extending_pays(extra, len(ids)):
            return 0
        return common

    def _extending_pays(self, extra: int, prompt: int) -> bool:
        """Whether `extra` decode steps cost less than a prefill of `prompt` tokens, by
        the model's own running figures: ms per decode step against ms per prefilled
        token (no figures yet: assume they do)."""
        if self.policy == "always" or extra == 0:
            return True
        s = self.model.stats
        if s.decode_calls == 0 or s.prefill_tokens == 0:
            return True
        return extra * s.decode_ms / s.decode_calls < prompt * s.prefill_ms / s.prefill_tokens

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        ids = [int(i) for i in ids]
        reuse = 0 if all_logits else self.cached_prefix(ids)
        self._verified = None
        self.last_cached_tokens = reuse
        if reuse == 0:
            self._ids, self._logits = [], None
            out = self.model.prefill(ids, all_logits=all_logits)
            self._ids = ids
            self._logits = None if all_logits else out
            return out
        logits = self._logits
        if reuse < len(self._ids):
            self._logits = None
            self.model.truncate(reuse)
            del self._ids[reuse:]
        for token in ids[reuse:]:
            logits = self.decode(token)
        assert logits is not None
        return logits

    def decode(self, token: int) -> np.ndarray:
        self._logits = self._verified = None   # if decode fails, what the cache holds is unknown
        out = self.model.decode(token)
        self._ids.append(int(token))
        self._logits = out
        return out

    def reset(self) -> None:
        self._ids, self._logits, self._verified = [], None, None
        self.model.reset()

    def truncate(self, n: int) -> None:
        self.model.truncate(n)
        del self._ids[n:]
        self._logits = None
        rows, self._verified = self._verified, None
        if rows is not None and rows[0] < n <= rows[0] + len(rows[1]):
            self._logits = rows[1][n - rows[0] - 1]   # a verify's row: the logits after n

    # ---- speculative decoding (orion.speculative) ------------------------------------

    def plan_verify(self, rows: int) -> int:
        return self.model.plan_verify(rows)

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        self._logits = None
        start = len(self._ids)
        out = self.model.verify(tokens)
        self._ids.extend(int(t) for t in tokens)
        self._logits, self._verified = out[-1], (start, out)
        return out

    def load_adapter(self, path: str | os.PathLike[str], name: str = "default") -> None:
        self.model.load_adapter(path, name)

    def set_adapter(self, name: str | None) -> None:
        self.model.set_adapter(name)

    @property
    def active_adapter(self) -> str | None:
        return self.model.active_adapter

    def close(self) -> None:
        self._ids, self._logits = [], None
        self.model.close()
