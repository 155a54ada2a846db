"""numpy's BLAS on Orion's kernel threads: one thread pool per process.

On vane the device programs run on the same CPU cores as the host's weight-gradient
products. OpenBLAS (numpy's BLAS on Linux wheels) keeps a pool of its own whose idle
threads spin for about 0.1 s after each call, and in a training step they took a core
from the device programs and the optimizer pass that follow each host product: a
Stories110M step ran ~9% faster with them asleep. OpenBLAS 0.3.27+ can hand its
parallel jobs to the caller (`openblas_set_threads_callback_function`); `share` gives
it `orion_blas_run_jobs`, which runs them on vane's kernel threads. The products are
OpenBLAS's own, bit for bit; only the threads that run them change.

With another BLAS (MKL, Accelerate on macOS, an OpenMP OpenBLAS) nothing is changed:
`share` returns False.
"""

from __future__ import annotations

import ctypes
from typing import Any

from orion.runtime._native import ffi, lib

MIN_VERSION = (0, 3, 27)       # the first OpenBLAS with the threads callback
_PREFIXES = ("", "scipy_")     # scipy-openblas builds prefix and suffix their symbols
_SUFFIXES = ("", "64_", "_64")
_installed: dict[str, Any] = {}    # library path -> its setter


def _version(text: str | None) -> tuple[int, ...]:
    parts = []
    for p in (text or "").split(".")[:3]:
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def _setter(path: str) -> Any | None:
    library = ctypes.CDLL(path)     # already loaded by numpy: the same handle
    for prefix in _PREFIXES:
        for suffix in _SUFFIXES:
            fn = getattr(library, f"{prefix}openblas_set_threads_callback_function{suffix}",
                         None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_void_p], None
                return fn
    return None


def _openblas_libraries() -> list[str]:
    """Paths of the pthreads OpenBLAS builds loaded in this process that have the
    threads callback."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:   # a runtime dependency; absent only in a broken install
        return []
    return [info["filepath"] for info in threadpool_info()
            if info.get("internal_api") == "openblas"
            and info.get("threading_layer") == "pthreads"
            and _version(info.get("version")) >= MIN_VERSION]


def share() -> bool:
    """Makes the loaded OpenBLAS run its parallel jobs on Orion's kernel threads.
    Returns whether any library now does (False: no OpenBLAS with the callback)."""
    import numpy as np

    np.dot(np.ones(2), np.ones(2))     # numpy has loaded its BLAS before we look
    address = int(ffi.cast("uintptr_t", ffi.addressof(lib, "orion_blas_run_jobs")))
    for path in _openblas_libraries():
        if path in _installed:
            continue
        setter = _setter(path)
        if setter is not None:
            setter(address)
            _installed[path] = setter
    return bool(_installed)


def unshare() -> None:
    """Gives OpenBLAS its own threads back."""
    while _installed:
        _, setter = _installed.popitem()
        setter(None)


def shared() -> bool:
    return bool(_installed)
