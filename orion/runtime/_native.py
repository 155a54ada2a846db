"""The cffi binding of the native core (ABI mode).

The declarations come from the C header itself (the region between the
ORION_CDEF_BEGIN / ORION_CDEF_END markers of orion.h), so Python cannot drift
from C. The library is the one built into this package, or the one named by
ORION_LIBRARY (a sanitizer build, a development build).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from cffi import FFI

from orion.errors import ERRORS_BY_STATUS_NAME, OrionError

_PACKAGE_DIR = Path(__file__).resolve().parents[1]   # orion/
_HEADER_CANDIDATES = (
    _PACKAGE_DIR / "include" / "orion.h",  # installed package
    _PACKAGE_DIR.parent / "csrc" / "orion.h",  # source tree
)


def _library_name() -> str:
    if sys.platform == "darwin":
        return "liborion.dylib"
    return "liborion.so"


def _find_header() -> Path:
    for path in _HEADER_CANDIDATES:
        if path.is_file():
            return path
    raise OrionError(f"orion.h not found (looked in {', '.join(map(str, _HEADER_CANDIDATES))})")


def _find_library() -> Path:
    override = os.environ.get("ORION_LIBRARY")
    if override:
        path = Path(override)
        if not path.is_file():
            raise OrionError(f"ORION_LIBRARY={override} does not name a file")
        return path
    candidates = [_PACKAGE_DIR / _library_name()]
    # A development build: cmake -S . -B build && cmake --build build
    candidates.append(_PACKAGE_DIR.parent / "build" / _library_name())
    for path in candidates:
        if path.is_file():
            return path
    raise OrionError(
        "the native library is not built: install the package (pip install .) or build it "
        "with `cmake -S . -B build && cmake --build build`, or set ORION_LIBRARY"
    )


def cdef_source(header_text: str) -> str:
    """The declarations between the cdef markers, as cffi reads them."""
    match = re.search(r"/\* ORION_CDEF_BEGIN \*/(.*)/\* ORION_CDEF_END \*/", header_text, re.S)
    if not match:
        raise OrionError("orion.h has no ORION_CDEF_BEGIN/END region")
    return match.group(1)


ffi = FFI()
ffi.cdef(cdef_source(_find_header().read_text()))
LIBRARY_PATH = _find_library()
lib = ffi.dlopen(str(LIBRARY_PATH))


def last_error() -> str:
    return ffi.string(lib.orion_last_error()).decode("utf-8", "replace")


def check(status: int, context: str = "") -> None:
    """Raises the typed exception for a failed status; the one place errors cross."""
    if status == lib.ORION_OK:
        return
    name = ffi.string(lib.orion_status_name(status)).decode()
    message = last_error() or name
    if context:
        message = f"{context}: {message}"
    raise ERRORS_BY_STATUS_NAME.get(name, OrionError)(message)


def read_string(call: object, *args: object, capacity: int = 4096) -> str:
    """Calls a C function that fills a char buffer and returns the text."""
    buf = ffi.new("char[]", capacity)
    check(call(*args, buf, capacity))  # type: ignore[operator]
    return ffi.string(buf).decode("utf-8", "replace")
