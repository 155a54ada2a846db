"""Typed exceptions: every error Orion raises is an `OrionError`.

Every C status code maps to one class here; `orion.runtime._native.check` is the one
place that turns a status into an exception. The Python layers raise these or
subclasses of them defined beside the code that raises them.
"""

from __future__ import annotations

import re


class OrionError(Exception):
    """Base class of every error Orion raises."""

    status_name = "ORION_ERR"


class InvalidArgumentError(OrionError, ValueError):
    """An argument was NULL, zero, out of range or otherwise absurd."""

    status_name = "ORION_ERR_INVALID_ARGUMENT"


class ConfigError(OrionError, ValueError):
    """A config file or config value is malformed or out of range; the message names
    the file and the field."""

    status_name = "ORION_ERR_CONFIG"


class DataError(OrionError, ValueError):
    """A data file (a training corpus, a token file) is unusable; the message names it."""

    status_name = "ORION_ERR_DATA"


class ModelLoadError(OrionError, ValueError):
    """A model folder or file is missing a file, names an unknown architecture, or holds
    a tensor of the wrong name, shape or value; the message names the file."""


class LoraError(OrionError, ValueError):
    """An adapter file or option Orion cannot use, named in the message."""


class PlanError(OrionError, ValueError):
    """A model's programs cannot be laid out on the device as asked; the message says
    which program and which limit."""


class OutOfMemoryError(OrionError, MemoryError):
    status_name = "ORION_ERR_OUT_OF_MEMORY"


class IOFailure(OrionError, OSError):
    """A file could not be read or written."""

    status_name = "ORION_ERR_IO"


class BlobFormatError(OrionError, ValueError):
    """A weight blob file is malformed (truncated, bad magic, bad offsets)."""

    status_name = "ORION_ERR_FORMAT"


class ParseError(OrionError, ValueError):
    """MIL text does not parse; the message carries line and column."""

    status_name = "ORION_ERR_PARSE"


class ConstraintError(OrionError):
    """A program violates an ANE constraint; `constraint_id` names it (ANE-Cnn)."""

    status_name = "ORION_ERR_CONSTRAINT"

    @property
    def constraint_id(self) -> str | None:
        match = re.search(r"ANE-C\d+", str(self))
        return match.group(0) if match else None


class CompileBudgetError(ConstraintError):
    """The per-process compile budget (ANE-C31) is spent."""

    status_name = "ORION_ERR_BUDGET"


class ReleasedError(OrionError):
    """A surface or program was used after its release."""

    status_name = "ORION_ERR_RELEASED"


class StateError(OrionError):
    """A call in the wrong life-cycle state (eval while unloaded, patch while loaded)."""

    status_name = "ORION_ERR_STATE"


class BackendUnavailableError(OrionError):
    """The requested backend is not built in or not usable on this machine."""

    status_name = "ORION_ERR_BACKEND_UNAVAILABLE"


class EvalError(OrionError):
    """The backend failed to evaluate a program."""

    status_name = "ORION_ERR_EVAL"


class InternalError(OrionError):
    status_name = "ORION_ERR_INTERNAL"


class MissingExtraError(OrionError, ImportError):
    """An optional extra (serve, plot, distributed) is not installed; the message says
    how to install it (orion.extras.install_hint)."""


ERRORS_BY_STATUS_NAME: dict[str, type[OrionError]] = {
    cls.status_name: cls
    for cls in (
        InvalidArgumentError,
        OutOfMemoryError,
        IOFailure,
        BlobFormatError,
        ParseError,
        ConstraintError,
        CompileBudgetError,
        ReleasedError,
        StateError,
        BackendUnavailableError,
        EvalError,
        InternalError,
    )
}
