"""Orion: program Apple's Neural Engine directly to run and train transformer LMs.

Everything runs unchanged on `vane`, the virtual ANE, wherever there is no
Neural Engine (Linux, CI, Intel Macs).
"""

from __future__ import annotations

from orion.errors import (
    BackendUnavailableError,
    BlobFormatError,
    CompileBudgetError,
    ConstraintError,
    EvalError,
    OrionError,
    ParseError,
    ReleasedError,
    StateError,
)
from orion.generate import (
    GenerationResponse,
    GenerationStats,
    generate,
    load,
    stream_generate,
)

__version__ = "0.1.0"


def backends() -> list[str]:
    """Backends usable in this process, best first (e.g. ["vane"])."""
    from orion.runtime import backends as _backends

    return _backends()


__all__ = [
    "BackendUnavailableError",
    "BlobFormatError",
    "CompileBudgetError",
    "ConstraintError",
    "EvalError",
    "GenerationResponse",
    "GenerationStats",
    "OrionError",
    "ParseError",
    "ReleasedError",
    "StateError",
    "__version__",
    "backends",
    "generate",
    "load",
    "stream_generate",
]
