"""orion.bench's figures and table: tokens per second from each run's nanoseconds, the
mean and sample standard deviation, llama-bench's markdown layout."""

from __future__ import annotations

import pytest

from orion.bench import BenchResult, check_counts, table
from orion.errors import InvalidArgumentError


def test_tokens_per_second_from_the_runs():
    r = BenchResult("tg100", 0, 100, 0, 100, 5, [1_000_000_000, 500_000_000])
    assert r.samples_ts == [100.0, 200.0]
    assert r.avg_ts == 150.0 and r.stddev_ts == pytest.approx(70.7107, rel=1e-5)
    j = r.to_json()
    assert j["avg_ns"] == 750_000_000 and j["n_gen"] == 100 and j["warmup_ns"] == 5


def test_table_is_llama_benchs():
    rows = [BenchResult("pp128", 128, 0, 0, 128, 0, [100_000_000, 100_000_000]),
            BenchResult("tg8", 0, 8, 0, 8, 0, [1_000_000_000])]
    text = table(rows, "m", "2.2M", "vane", 2).splitlines()
    assert text == [
        "| model | params | backend | threads | test  |             t/s |",
        "| ----- | -----: | ------- | ------: | ----- | --------------: |",
        "| m     |   2.2M | vane    |       2 | pp128 | 1,280.00 ± 0.00 |",
        "| m     |   2.2M | vane    |       2 | tg8   |     8.00 ± 0.00 |"]
    assert all(len(line) == len(text[0]) for line in text)


def test_counts():
    assert check_counts([0, 32, 128], "-p") == [32, 128]
    with pytest.raises(InvalidArgumentError, match="-n -1: token counts must be >= 0"):
        check_counts([-1], "-n")
