"""numpy's OpenBLAS on Orion's kernel threads (orion.runtime.host_blas, orion_blas_run_jobs)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from orion.runtime import host_blas, num_threads, set_num_threads
from orion.runtime._native import ffi, lib


@pytest.fixture
def threads():
    before = num_threads()
    yield set_num_threads
    set_num_threads(before)


def _run_jobs_that_wait_for_each_other(numjobs: int) -> list[int]:
    """Each job waits (up to 5 s) until every job has started, as OpenBLAS's level-3
    jobs wait for each other's panels; returns the jobs that saw all the others."""
    lock, started, saw_all = threading.Lock(), [0], []

    @ffi.callback("void(int, void *, int)")
    def dojob(thread_num: int, data: object, arg: int) -> None:
        assert int(ffi.cast("intptr_t", data)) == 16 * thread_num and arg == 7
        with lock:
            started[0] += 1
        deadline = time.monotonic() + 5.0
        while started[0] < numjobs and time.monotonic() < deadline:
            time.sleep(0.001)
        if started[0] == numjobs:
            with lock:
                saw_all.append(thread_num)

    lib.orion_blas_run_jobs(1, dojob, numjobs, 16, ffi.cast("void *", 0), 7)
    return sorted(saw_all)


@pytest.mark.parametrize("pool, numjobs", [(2, 2), (2, 5), (1, 2), (3, 1)])
def test_jobs_run_all_at_once(threads, pool, numjobs):
    """All jobs of a call run concurrently, also when the pool has fewer threads
    than jobs (those get threads of their own): anything less would hang OpenBLAS."""
    threads(pool)
    assert _run_jobs_that_wait_for_each_other(numjobs) == list(range(numjobs))


def test_shared_products_are_openblas_bit_for_bit(threads):
    if not host_blas._openblas_libraries():
        pytest.skip("numpy here is not on a pthreads OpenBLAS >= 0.3.27 (runs on Linux "
                    "numpy wheels, whose scipy-openblas has the threads callback)")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 700), dtype=np.float32)
    b = rng.standard_normal((700, 900), dtype=np.float32)
    host_blas.unshare()
    want = a @ b
    try:
        assert host_blas.share() and host_blas.shared()
        for pool in (2, 1, 3):     # 1: OpenBLAS's jobs outnumber the pool's threads
            threads(pool)
            np.testing.assert_array_equal(a @ b, want)
            np.testing.assert_array_equal(a.T.copy().T @ b, want)
        assert host_blas.share()   # idempotent
    finally:
        host_blas.unshare()
    assert not host_blas.shared()
    np.testing.assert_array_equal(a @ b, want)


def test_no_openblas_with_the_callback_changes_nothing(monkeypatch):
    host_blas.unshare()
    monkeypatch.setattr(host_blas, "_openblas_libraries", lambda: [])
    assert host_blas.share() is False and not host_blas.shared()
    assert host_blas._version("0.3.31.188.0") == (0, 3, 31)
    assert host_blas._version("0.3.26") < host_blas.MIN_VERSION
    assert host_blas._version(None) == ()


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"),
                    reason="fork() is POSIX only; runs on Linux and macOS")
def test_a_forked_child_gets_a_working_pool(threads):
    """After fork the child has none of the pool's threads: its first parallel kernel
    or shared BLAS product must start the pool over, not wait for them forever."""
    import os

    threads(2)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((400, 500), dtype=np.float32)
    want = a @ a.T
    from orion.runtime.fp16 import to_fp16

    to_fp16(np.ones(1 << 20, np.float32))     # the pool's workers are running
    shared = host_blas.share()
    try:
        pid = os.fork()
        if pid == 0:     # the child: exit status says whether both worked
            ok = np.array_equal(a @ a.T, want) and to_fp16(np.ones(1 << 20, np.float32)).all()
            os._exit(0 if ok else 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child hung (BLAS shared: {shared})")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        host_blas.unshare()
