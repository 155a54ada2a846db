"""The C core through cffi: surfaces (`surface`), programs (`program`), process-wide
state (`process`), the decode sequence (`sequence`), weight blob files (`blob`), and
the host helpers the hot path uses (`fp16`, `finite`, `heap`, `host_blas`). The names
most callers want are here."""

from orion.runtime.process import (
    BACKEND_NAMES,
    OpTime,
    backends,
    compile_budget,
    compile_count,
    describe_backend,
    live_programs,
    loaded_programs,
    num_threads,
    parsed_mil_bytes,
    resolve_backend,
    set_compile_budget,
    set_num_threads,
    vane_isa,
    vane_profile,
    vane_profile_read,
    vane_warm,
    weight_memory_bytes,
)
from orion.runtime.program import NUMERICS, HwTime, IOInfo, Program, UpdateStats, update_stats
from orion.runtime.surface import MIN_SURFACE_BYTES, Surface, live_surfaces

__all__ = ["BACKEND_NAMES", "MIN_SURFACE_BYTES", "NUMERICS", "HwTime", "IOInfo", "OpTime",
           "Program", "Surface", "UpdateStats", "backends", "compile_budget",
           "compile_count", "describe_backend", "live_programs", "live_surfaces",
           "loaded_programs", "num_threads", "parsed_mil_bytes", "resolve_backend",
           "set_compile_budget", "set_num_threads", "update_stats", "vane_isa", "vane_profile",
           "vane_profile_read", "vane_warm", "weight_memory_bytes"]
