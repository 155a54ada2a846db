"""Process-wide state of the C core: the backends, the compile budget (ANE-C31) and
counters, threads, and vane's settings and profile."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orion.errors import BackendUnavailableError, InvalidArgumentError
from orion.runtime._native import check, ffi, lib, read_string

BACKEND_NAMES = ("ane", "vane")


def backends() -> list[str]:
    """The backends usable in this process, best first."""
    text = read_string(lib.orion_backends)
    return [name for name in text.split(",") if name]


def resolve_backend(backend: str | None = None) -> str:
    """The backend a new program gets, as the C core chooses it: `backend`; for None or
    "auto", ORION_BACKEND when set, else the best available. A name that is not a
    backend is an error naming where it came from, never carried along silently."""
    name, source = backend, f"backend={backend!r}"
    if name in (None, "", "auto"):
        name, source = os.environ.get("ORION_BACKEND") or "auto", "ORION_BACKEND"
        source = f"ORION_BACKEND={name}" if name != "auto" else "auto"
    if name == "auto":
        found = backends()
        if not found:
            raise BackendUnavailableError("no backend is available: " + describe_backend("vane"))
        return found[0]
    if name not in BACKEND_NAMES:
        raise InvalidArgumentError(
            f"{source}: unknown backend {name!r} (expected one of {', '.join(BACKEND_NAMES)} "
            "or 'auto')")
    if name not in backends():
        raise BackendUnavailableError(f"{source}: {describe_backend(name)}")
    return name


def describe_backend(name: str) -> str:
    return read_string(lib.orion_backend_describe, name.encode())


def compile_count() -> int:
    """Compiles spent by this process (ANE-C31 budget)."""
    return int(lib.orion_compile_count())


def compile_budget() -> int:
    return int(lib.orion_compile_budget())


def set_compile_budget(budget: int) -> None:
    check(lib.orion_set_compile_budget(int(budget)))


def live_programs() -> int:
    return int(lib.orion_program_live_count())


def loaded_programs() -> int:
    return int(lib.orion_program_loaded_count())


def weight_memory_bytes() -> int:
    """Weight bytes held in memory for loaded vane programs, an equal tensor once."""
    return int(lib.orion_weight_memory_bytes())


def parsed_mil_bytes() -> int:
    """Bytes of parsed MIL held for live programs (none once vane has compiled one)."""
    return int(lib.orion_parsed_mil_bytes())


def set_num_threads(n: int) -> None:
    check(lib.orion_set_num_threads(int(n)))


def num_threads() -> int:
    return int(lib.orion_num_threads())


def vane_isa() -> str:
    return ffi.string(lib.orion_vane_isa()).decode()


def vane_warm(enable: bool) -> None:
    """Turns vane's warm-up on (the default) or off (`orion_vane_warm`)."""
    check(lib.orion_vane_warm(1 if enable else 0))


@dataclass(frozen=True)
class OpTime:
    """Wall time vane spent in one op kind since profiling was turned on."""

    op: str          # MIL spelling
    shape: str       # "gemv" (one live column) or "gemm" for conv / matmul, else ""
    steps: int
    seconds: float


def vane_profile(enable: bool) -> None:
    """Turns vane's per-op-kind step timing on (resetting it) or off."""
    check(lib.orion_vane_profile(1 if enable else 0))


def vane_profile_read() -> list[OpTime]:
    """The per-op-kind times so far, most time first."""
    n = int(lib.orion_vane_profile_read(ffi.NULL, 0))
    rows = ffi.new("orion_vane_op_time[]", max(n, 1))
    n = min(n, int(lib.orion_vane_profile_read(rows, n)))
    out = [OpTime(ffi.string(r.op).decode(), ffi.string(r.shape).decode(), int(r.steps),
                  int(r.ns) / 1e9) for r in rows[0:n]]
    return sorted(out, key=lambda t: -t.seconds)
