"""Gives the C heap's free pages back to the system after a program is built.

Building a program holds its weights several times over for a moment (fp16 arrays,
graph constants, blob bytes). glibc's malloc keeps such freed blocks resident when a
long-lived block (a loaded program's weights) was allocated above them, so without
this a model's RSS grows by part of every build's temporaries: on GPT-2 124M, 40 MiB
over its 235 MiB of weights. `malloc_trim(0)` returns free pages from anywhere in the
heap (glibc 2.8 and later); where there is no such call (macOS's allocator returns
large blocks itself) this does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


_TRIM = _malloc_trim()


def release_free_heap() -> None:
    """Returns the heap's free pages to the system, where the C library can."""
    if _TRIM is not None:
        _TRIM(0)
