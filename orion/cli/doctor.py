"""`orion doctor`: what this installation found — library, backends, and why
a backend is unavailable (e.g. no AppleNeuralEngine.framework off a Mac)."""

from __future__ import annotations

import argparse
import os
import platform
import sys

ENV_VARS = (
    "ORION_BACKEND",
    "ORION_LIBRARY",
    "ORION_ANE_FRAMEWORK",
    "ORION_ANE_DELTA",
    "ORION_ANE_REPROBE",
    "ORION_ANE_KEEP_TEMP",
    "ORION_ANE_PERF_STATS",
    "ORION_CACHE_DIR",
    "ORION_COMPILE_BUDGET",
    "ORION_VANE_ISA",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="show the native library, the backends found and why any is unavailable",
        description="Prints what Orion found: the native library, each backend (ane, vane) "
        "with what was found or why it is unavailable, the backend `auto` picks, the compile "
        "budget and the environment variables that change any of it.",
    )
    parser.set_defaults(func=run)


def report() -> list[str]:
    """The lines `orion doctor` prints."""
    from orion import __version__, _native
    from orion.errors import OrionError
    from orion.runtime import (
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
        f"python: {sys.version.split()[0]} on {platform.system()} {platform.release()} "
        f"({platform.machine()})",
    ]
    if sys.platform == "darwin":
        lines.append(f"macOS: {platform.mac_ver()[0] or 'unknown'}")
    found = backends()
    lines.append(f"backends usable: {', '.join(found) if found else 'none'}")
    for name in ("ane", "vane"):
        lines.append(f"  {describe_backend(name)}")
    chosen = os.environ.get("ORION_BACKEND") or "auto"
    try:
        pick = resolve_backend()
    except OrionError as e:   # e.g. ORION_BACKEND=bogus: say so, as compile would
        pick = f"none, {e}"
    lines.append(f"backend for new programs: {pick} (ORION_BACKEND={chosen})")
    if chosen == "auto" and pick == "vane":
        lines.append(f"  auto falls back to vane: {_why_not('ane', describe_backend('ane'))}")
    lines.append(f"vane kernels: {vane_isa()}, {num_threads()} threads")
    lines.append(f"compile budget: {compile_count()} of {compile_budget()} spent (ANE-C31)")
    for var in ENV_VARS:
        if os.environ.get(var):
            lines.append(f"env {var}={os.environ[var]}")
    return lines


def _why_not(name: str, description: str) -> str:
    """"ane: unavailable: <why>" -> "ane is unavailable: <why>"."""
    return f"{name} is {description.split(': ', 1)[-1]}"


def run(args: argparse.Namespace) -> int:
    for line in report():
        print(line)
    return 0
