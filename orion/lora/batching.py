"""How `orion lora` shapes its sequences: never past the model's context, and each
batch padded to its own longest row, not to the dataset's longest.

The device runs programs of one fixed sequence length, so a batch runs at a *bucket*:
the next power of two at or above its longest row (at least `MIN_BUCKET`), at most
the run's longest. Each bucket's programs compile the first time a batch needs them
(`BucketRunners`): a handful of buckets, where padding every batch to 2048 positions
made a step on the shipped 256-token model cost 5x a step at 128 (issue 34).
Padding never changes a loss or a gradient: padded positions carry no loss, and
attention is causal, so real positions never see them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

MIN_BUCKET = 32


def capped_seq_length(requested: int, context: int) -> int:
    """The longest sequence a run trains on: `--max-seq-length`, but not past the
    model's context (positions past it have no trained rotary angle or cache)."""
    return max(1, min(int(requested), int(context)))


def bucket(longest: int, cap: int) -> int:
    """The sequence length a batch whose longest row has `longest` positions runs at."""
    size = max(MIN_BUCKET, 1 << max(int(longest) - 1, 0).bit_length())
    return min(size, int(cap))


def padded_batch(split: Any, indices: np.ndarray, cap: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, targets, mask) of the examples `indices` of a `orion.lora.data.Split`,
    padded to their bucket."""
    longest = max(len(split.examples[int(i)].ids) - 1 for i in indices)
    return split.batch(indices, bucket(longest, cap))


class BucketRunners:
    """The training step of each bucket (`make(seq)` builds one, e.g. a LoraStep),
    built on first use; each keeps its own copy of the adapter's inputs, so all of
    them are rewritten after an optimizer step."""

    def __init__(self, make: Callable[[int], Any]) -> None:
        self._make = make
        self._runners: dict[int, Any] = {}

    def __call__(self, seq: int) -> Any:
        if seq not in self._runners:
            self._runners[seq] = self._make(seq)
        return self._runners[seq]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._runners.values())

    def write_adapter(self, adapter: Any) -> None:
        for runner in self:
            runner.write_adapter(adapter)

    @property
    def host_ms(self) -> float:
        return sum(runner.host_ms for runner in self)

    def release(self) -> None:
        for runner in self:
            runner.release()
        self._runners.clear()
