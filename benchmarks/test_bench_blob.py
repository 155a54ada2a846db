"""Blob write and in-place patch throughput for a 100 MB blob, against a plain
file write of the same bytes (the floor any blob writer pays)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from orion.runtime.blob import patch_blob_entries, write_blob

MB = 1 << 20
TOTAL_BYTES = 100 * MB
N_TENSORS = 50  # 2 MB each: a layer stack's worth of weight matrices


@pytest.fixture(scope="module")
def tensors() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    per = TOTAL_BYTES // N_TENSORS // 2
    return [(f"w{i:02d}", rng.standard_normal(per).astype(np.float16)) for i in range(N_TENSORS)]


def plain_write(path: str, arrays: list[np.ndarray]) -> None:
    with open(path, "wb") as f:
        for arr in arrays:
            f.write(memoryview(arr).cast("B"))
        f.flush()
        os.fsync(f.fileno())  # the blob writer fsyncs too (atomic write)


def gbps(seconds: float) -> float:
    return TOTAL_BYTES / seconds / 1e9


def test_plain_file_write(benchmark, tmp_path, tensors, figures):
    path = str(tmp_path / "plain.bin")
    benchmark.pedantic(plain_write, args=(path, [a for _, a in tensors]), rounds=5)
    figures.plain_write_s = benchmark.stats.stats.median
    figures.add("plain file write 100 MB (fsync)", gbps(figures.plain_write_s), "GB/s")


def test_blob_write(benchmark, tmp_path, tensors, figures):
    path = tmp_path / "weights.bin"
    benchmark.pedantic(write_blob, args=(path, tensors), rounds=5)
    seconds = benchmark.stats.stats.median
    figures.add("blob write 100 MB (atomic, fsync)", gbps(seconds), "GB/s")
    figures.ratio("blob write / plain write throughput", figures.plain_write_s / seconds, 1.0)


def plain_pwrite(path: str, arrays: list[np.ndarray]) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        at = 0
        for arr in arrays:
            os.pwrite(fd, memoryview(arr).cast("B"), at)
            at += arr.nbytes
    finally:
        os.close(fd)


def test_plain_in_place_rewrite(benchmark, tmp_path, tensors, figures):
    path = str(tmp_path / "plain.bin")
    plain_write(path, [a for _, a in tensors])
    benchmark.pedantic(plain_pwrite, args=(path, [a for _, a in tensors]), rounds=5)
    figures.plain_pwrite_s = benchmark.stats.stats.median
    figures.add("plain in-place rewrite 100 MB", gbps(figures.plain_pwrite_s), "GB/s")


def test_blob_patch_in_place(benchmark, tmp_path, tensors, figures):
    path = tmp_path / "weights.bin"
    offsets = write_blob(path, tensors)
    updated = [(name, arr + np.float16(1)) for name, arr in tensors]

    patches = {offsets[name]: arr for name, arr in updated}
    benchmark.pedantic(patch_blob_entries, args=(path, patches), rounds=5)
    seconds = benchmark.stats.stats.median
    figures.add("blob patch in place, all 50 entries (100 MB)", gbps(seconds), "GB/s")
    figures.ratio("blob patch / plain in-place rewrite throughput",
                  figures.plain_pwrite_s / seconds, 1.0)
