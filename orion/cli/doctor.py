"""`orion doctor`: what this installation found — library, backends, and why
a backend is unavailable (e.g. no AppleNeuralEngine.framework off a Mac)."""

from __future__ import annotations

import argparse
import os
import platform
import sys

# Every variable the library or the package reads at run time, with what it changes.
# tests/cli/test_doctor.py checks this list against the sources' getenv calls.
ENV_VARS = {
    "ORION_BACKEND": "backend for new programs: ane, vane or auto (unset: auto)",
    "ORION_LIBRARY": "the native library to load instead of the package's",
    "ORION_COMPILE_BUDGET": "compiles allowed per process (unset: 119, ANE-C31)",
    "ORION_CACHE_DIR": "folder of compiled program folders (unset: $TMPDIR/orion-UID)",
    "ORION_CACHE_MAX_BYTES": "bound of the program store under ORION_CACHE_DIR, least "
                             "recently used entries go first; 0: no store (unset: 8 GiB)",
    "ORION_PROGRAM_STORE": "off: models compile every program instead of opening those "
                           "an earlier process kept (unset: on)",
    "ORION_VANE_ISA": "vane's kernels: avx512, avx512-f16c (AVX-512 without its fp16 "
                      "arithmetic), avx2, neon or scalar (unset: the best this CPU runs)",
    "ORION_ANE_FRAMEWORK": "the AppleNeuralEngine framework binary to load (unset: the "
                           "system's)",
    "ORION_ANE_IOSURFACE": "the IOSurface framework binary to load (unset: the system's)",
    "ORION_ANE_DELTA": "how the ane backend updates weights: auto, recompile or refuse "
                       "(unset: auto)",
    "ORION_ANE_REPROBE": "proven ane weight updates between two probes of a program; 0: "
                         "never (unset: 20)",
    "ORION_ANE_KEEP_TEMP": "1 keeps every ane program's temp folder (unset: left once "
                           "compiled)",
    "ORION_ANE_PERF_STATS": "1 has each ane evaluation report its device time (unset: off)",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="show the native library, the backends found and why any is unavailable",
        description="Prints what Orion found: the native library, each backend (ane, vane) "
        "with what was found or why it is unavailable, the backend `auto` picks, the compile "
        "budget, and every environment variable that changes any of it, set or unset, with "
        "what it does.",
    )
    parser.set_defaults(func=run)


def report() -> list[str]:
    """The lines `orion doctor` prints."""
    from orion import __version__
    from orion.errors import OrionError
    from orion.runtime import (
        _native,
        backends,
        compile_budget,
        compile_count,
        describe_backend,
        num_threads,
        resolve_backend,
        vane_isa,
    )

    lines = [
        f"orion {__version__} (library {_native.ffi.string(_native.lib.orion_version()).decode()})",
        f"library: {_native.LIBRARY_PATH}",
        "cffi declarations: " + ("prebuilt at build time" if _native.BINDINGS == "prebuilt"
                                 else "parsed from orion.h at import"),
        f"python: {sys.version.split()[0]} on {platform.system()} {platform.release()} "
        f"({platform.machine()})",
    ]
    if sys.platform == "darwin":
        lines.append(f"macOS: {platform.mac_ver()[0] or 'unknown'}")
    found = backends()
    lines.append(f"backends usable: {', '.join(found) if found else 'none'}")
    for name in ("ane", "vane"):
        lines.append(f"  {describe_backend(name)}")
    chosen = os.environ.get("ORION_BACKEND")
    try:
        pick = resolve_backend()
    except OrionError as e:   # e.g. ORION_BACKEND=bogus: say so, as compile would
        pick = f"none, {e}"
    lines.append(f"backend for new programs: {pick} "
                 f"({f'ORION_BACKEND={chosen}' if chosen else 'ORION_BACKEND unset: auto'})")
    if chosen in (None, "auto") and pick == "vane":
        lines.append(f"  auto falls back to vane: {_why_not('ane', describe_backend('ane'))}")
    lines.append(f"vane kernels: {vane_isa()}, {num_threads()} threads")
    lines.append(f"compile budget: {compile_count()} of {compile_budget()} spent (ANE-C31)")
    lines.append("environment:")
    width = max(map(len, ENV_VARS))
    for var, meaning in ENV_VARS.items():
        value = os.environ.get(var)
        shown = f"={value}" if value else " unset"
        lines.append(f"  {var}{shown:<{width - len(var) + 12}} {meaning}")
    return lines


def _why_not(name: str, description: str) -> str:
    """"ane: unavailable: <why>" -> "ane is unavailable: <why>"."""
    return f"{name} is {description.split(': ', 1)[-1]}"


def run(args: argparse.Namespace) -> int:
    for line in report():
        print(line)
    return 0
