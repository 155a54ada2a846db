"""orion.runtime.heap: freed heap pages go back to the system (glibc), or nothing happens."""

from __future__ import annotations

import os

import numpy as np
import pytest

from orion.runtime import heap


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))


def test_release_free_heap_returns_freed_blocks_below_a_live_one():
    if heap._TRIM is None:
        pytest.skip("no malloc_trim in this C library (macOS): runs on Linux with glibc")
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("AddressSanitizer's allocator stands in for glibc's malloc here (the "
                    "sanitizer pass); runs in CI's plain test pass")
    # 64 KiB blocks come from the heap, not mmap (below glibc's 128 KiB threshold);
    # the last one stays alive above the freed ones, as a loaded program's weights do
    blocks = [np.ones(16 * 1024, np.float32) for _ in range(800)]      # 50 MiB
    keep = blocks.pop()
    del blocks
    before = _rss_kib()
    heap.release_free_heap()
    assert before - _rss_kib() > 20 * 1024
    assert keep.sum() == keep.size
