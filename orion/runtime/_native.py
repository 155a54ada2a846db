"""The cffi binding of the native core (ABI mode).

The declarations come from the C header itself (the region between the
ORION_CDEF_BEGIN / ORION_CDEF_END markers of orion.h), so Python cannot drift
from C. The library is the one built into this package, or the one named by
ORION_LIBRARY (a sanitizer build, a development build).

The build writes the parsed declarations beside the library (`csrc/gen_cffi.py`,
cffi's out-of-line ABI mode). They are used when they were made from the header read
here (`BINDINGS` is then "prebuilt"); otherwise, or where there are none, cffi parses
the header at import ("parsed"), which costs pycparser's 2 MiB and 30 ms.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from orion.errors import ERRORS_BY_STATUS_NAME, OrionError
from orion.runtime import cdef as _cdef

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
    try:
        return _cdef.cdef_source(header_text)
    except ValueError as e:
        raise OrionError(str(e)) from None


def _prebuilt_ffi(library: Path, declarations: str) -> Any | None:
    """The FFI of the module the build wrote beside `library`, if it was made from
    `declarations`; None when there is none, or it is stale or unreadable."""
    path = library.parent / f"{_cdef.MODULE_NAME}.py"
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(_cdef.MODULE_NAME, path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:   # another cffi's format, a damaged file: parse the header instead
        return None
    if getattr(module, _cdef.DIGEST_NAME, None) != _cdef.cdef_digest(declarations):
        return None
    return module.ffi


def _load_ffi(library: Path, declarations: str) -> tuple[Any, str]:
    """(the FFI, "prebuilt" or "parsed")."""
    ffi = _prebuilt_ffi(library, declarations)
    if ffi is not None:
        return ffi, "prebuilt"
    from cffi import FFI  # pycparser comes with it: only where nothing was prebuilt

    ffi = FFI()
    ffi.cdef(declarations)
    return ffi, "parsed"


LIBRARY_PATH = _find_library()
ffi, BINDINGS = _load_ffi(LIBRARY_PATH, cdef_source(_find_header().read_text()))
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
