"""The cffi binding: declarations come from the header, errors become types."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import orion
from orion.errors import ERRORS_BY_STATUS_NAME, InvalidArgumentError, OrionError
from orion.runtime import _native

HEADER = Path(_native.__file__).resolve().parents[2] / "csrc" / "orion.h"


def test_version_matches_library():
    assert orion.__version__ == _native.ffi.string(_native.lib.orion_version()).decode()


def test_backends_lists_vane():
    assert "vane" in orion.backends()


def test_cdef_is_the_header_region():
    text = _native._find_header().read_text()
    cdef = _native.cdef_source(text)
    # every function the header declares is reachable through the binding
    names = re.findall(r"\b(orion_\w+)\(", cdef)
    assert len(names) > 40
    for name in names:
        assert hasattr(_native.lib, name), name


def test_every_status_has_an_exception_class():
    for code in range(1, 13):
        name = _native.ffi.string(_native.lib.orion_status_name(code)).decode()
        assert name in ERRORS_BY_STATUS_NAME, name


def test_check_raises_typed_error_with_message():
    status = _native.lib.orion_surface_create(0, _native.ffi.new("orion_surface *"))
    with pytest.raises(InvalidArgumentError, match="surface size must be > 0"):
        _native.check(status)


def test_error_is_thread_local():
    import threading

    _native.lib.orion_surface_create(0, _native.ffi.new("orion_surface *"))
    seen = []

    def other() -> None:
        seen.append(_native.last_error())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [""]
    assert "surface size" in _native.last_error()


def test_missing_library_override_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("ORION_LIBRARY", "/nonexistent/liborion.so")
    with pytest.raises(OrionError, match="ORION_LIBRARY"):
        _native._find_library()


def test_header_is_shipped_or_in_tree():
    assert _native._find_header().is_file()
    assert HEADER.is_file() or (Path(_native.__file__).parents[1] / "include" / "orion.h").is_file()
