"""orion.lora.batching: sequences capped at the context, batches padded to a bucket of
their own longest row."""

from __future__ import annotations

import numpy as np
import pytest

from orion.lora.batching import (
    MIN_BUCKET,
    BucketRunners,
    bucket,
    capped_seq_length,
    padded_batch,
)
from orion.lora.data import Example, Split


def test_the_context_caps_the_sequence_length():
    assert capped_seq_length(2048, 256) == 256
    assert capped_seq_length(128, 256) == 128


@pytest.mark.parametrize(("longest", "cap", "want"), [
    (1, 2048, MIN_BUCKET), (32, 2048, 32), (33, 2048, 64), (100, 2048, 128),
    (129, 2048, 256), (200, 150, 150), (3, 16, 16)])
def test_bucket_is_the_next_power_of_two_within_the_cap(longest, cap, want):
    assert bucket(longest, cap) == want


def _split(lengths):
    return Split([Example(list(range(1, n + 2)), [1] * n) for n in lengths], 0)


def test_a_batch_is_padded_to_its_own_bucket_not_the_datasets_longest():
    split = _split([5, 9, 40, 200])
    tokens, targets, mask = padded_batch(split, np.array([0, 1]), cap=200)
    assert tokens.shape == targets.shape == mask.shape == (2, MIN_BUCKET)
    assert mask[0].sum() == 5 and mask[1].sum() == 9 and not mask[:, 9:].any()
    assert padded_batch(split, np.array([2, 0]), cap=200)[0].shape == (2, 64)
    assert padded_batch(split, np.array([3]), cap=200)[0].shape == (1, 200)


def test_bucket_runners_are_built_once_and_all_rewritten():
    built, written = [], []

    class Runner:
        host_ms = 1.0

        def __init__(self, seq):
            built.append(seq)

        def write_adapter(self, adapter):
            written.append(adapter)

        def release(self):
            pass

    runners = BucketRunners(Runner)
    assert runners(32) is runners(32) and runners(64) is not runners(32)
    runners.write_adapter("A")
    assert built == [32, 64] and written == ["A", "A"] and runners.host_ms == 2.0
    runners.release()
    assert list(runners) == []
