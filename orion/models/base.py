"""The protocol every causal LM in Orion implements, and what callers of it share.

A model is a stateful object on a backend: `prefill` runs a prompt as one sequence
and fills the KV cache, `decode` appends one token against that cache, `reset`
empties it. Both return fp32 logits on the host. The tokenizer travels with the
model (`model.tokenizer`), and `model.stats` counts what the device did, so that a
caller can tell per call how many programs were compiled and how often the program
cache served a request.

`orion.models.runtime.TransformerLM` is the implementation (one runtime for every
architecture); `orion.models.prefix_cache.PrefixCachedLM` wraps one.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from orion.errors import InvalidArgumentError
from orion.tokenizers.base import Tokenizer

# ---- protocols --------------------------------------------------------------


@dataclass
class ModelStats:
    """Cumulative counters of one model since it was loaded.

    programs_compiled: compiles this model spent (each counts against the
                       process budget, ANE-C31)
    programs_reused:   programs opened from the program store (an earlier process
                       compiled them; on vane no compile is spent)
    cache_hits:        requests for a program that was already compiled
    decode_evals:      program evaluations of the decode steps (the plan's layer
                       programs and head programs, per token)
    prefill_calls, decode_calls, prefill_ms, decode_ms: host wall time around the
                       device work, embedding and sampling excluded
    """

    programs_compiled: int = 0
    programs_reused: int = 0
    cache_hits: int = 0
    compile_ms: float = 0.0
    prefill_calls: int = 0
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    decode_calls: int = 0
    decode_ms: float = 0.0
    decode_evals: int = 0

    def snapshot(self) -> ModelStats:
        return replace(self)

    def since(self, before: ModelStats) -> ModelStats:
        """The counters accumulated since `before` (a snapshot of this object)."""
        # field by field: asdict deep-copies (a third of stream_generate's host time a token)
        return ModelStats(**{f.name: getattr(self, f.name) - getattr(before, f.name)
                             for f in fields(self)})


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only LM with a KV cache on a backend.

    config:      the architecture's arguments (`TransformerArgs`: dim, n_layers,
                 vocab_size, ...)
    tokenizer:   its tokenizer
    stats:       cumulative `ModelStats`
    position:    tokens in the KV cache now
    max_length:  the most tokens the cache holds (prompt + generated)
    prefill_buckets: the lengths a prefill runs at, ascending; the largest is the
                 longest prompt one prefill takes (past it, the rest runs as decode
                 steps, which give only the last position's logits)
    backend:     the backend the programs run on ("vane", "ane")
    """

    config: Any
    tokenizer: Tokenizer
    stats: ModelStats

    @property
    def position(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def prefill_buckets(self) -> tuple[int, ...]: ...

    @property
    def backend(self) -> str: ...

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Empties the cache, runs `ids` as one sequence and keeps its keys and values.

        Returns fp32 logits: [vocab] for the last position, or [len(ids), vocab]
        for every position when `all_logits`.
        """
        ...

    def decode(self, token: int) -> np.ndarray:
        """Runs one token at the next position against the cache: fp32 logits [vocab]."""
        ...

    def reset(self) -> None:
        """Empties the KV cache; compiled programs stay."""
        ...

    def truncate(self, n: int) -> None:
        """Keeps the first `n` cached tokens and forgets the rest."""
        ...

    def load_adapter(self, path: str | os.PathLike[str], name: str = "default") -> None:
        """Loads a PEFT LoRA adapter folder beside the others (it is not selected)."""
        ...

    def set_adapter(self, name: str | None) -> None:
        """Selects a loaded adapter by name, or None for the base model."""
        ...

    @property
    def active_adapter(self) -> str | None:
        """The selected adapter's name (None: the base model)."""
        ...

    def close(self) -> None:
        """Releases programs and surfaces. Idempotent."""
        ...


def smallest_bucket(buckets: Sequence[int], need: int) -> int:
    """The smallest of the sorted `buckets` that holds `need` tokens (the caller has
    checked that the largest does: `prefill_beyond_buckets`, a full KV cache)."""
    return next(b for b in buckets if b >= need)


def prefill_beyond_buckets(model: CausalLM, ids: Sequence[int], largest_bucket: int,
                           all_logits: bool, note: str = "") -> np.ndarray | None:
    """The checks every KV-cache model's `prefill` makes on a prompt of `ids`. A prompt
    longer than the largest prefill bucket runs here, as a prefill of its head and a
    decode step per remaining token, and its last logits are returned; None means the
    prompt fits a bucket and the caller prefills it. `note` says why the context ends
    where it does."""
    n = len(ids)
    if n == 0:
        raise InvalidArgumentError("prefill needs at least one token")
    if n > model.max_length:
        raise InvalidArgumentError(f"a prompt of {n} tokens is over the context of "
                                   f"{model.max_length}{note}")
    if n <= largest_bucket:
        return None
    if all_logits:
        raise InvalidArgumentError(f"all_logits needs the prompt in one prefill bucket (at "
                                   f"most {largest_bucket} tokens), got {n}")
    logits = model.prefill(ids[:largest_bucket])
    for token in ids[largest_bucket:]:
        logits = model.decode(token)
    return logits


def check_token_ids(ids: Sequence[Any], vocab_size: int) -> list[int]:
    """`ids` as a list of ints, each in [0, vocab_size): a negative id would wrap to
    the last rows of the embedding, a float or a bool would be truncated silently."""
    out = []
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise InvalidArgumentError(f"token {i} is {t!r}, not an integer id")
        if not 0 <= int(t) < vocab_size:
            raise InvalidArgumentError(f"token {i} is {int(t)}, outside the vocabulary "
                                       f"[0, {vocab_size})")
        out.append(int(t))
    return out


def human_count(n: int) -> str:
    """1234 -> "1.2K", 2_200_000 -> "2.2M", 124_439_808 -> "124.4M"."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def describe_model(model: CausalLM, architecture: str, parameters: int, shape: str,
                   closed: bool = False) -> str:
    """The `repr` of a model: what it is, how big, where it runs."""
    return (f"<{type(model).__name__} {architecture}, {human_count(parameters)}"
            f" parameters ({shape}), context {model.max_length} tokens, backend "
            f"{model.backend}{', closed' if closed else ''}>")
