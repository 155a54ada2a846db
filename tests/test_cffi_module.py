"""The build's prebuilt cffi declarations (csrc/gen_cffi.py): the same declarations as
parsing orion.h at import, used only when made from the header read, and an import
that uses them loads no C parser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orion.runtime import _native
from orion.runtime import cdef as cdef_module

REPO = Path(__file__).resolve().parents[1]
GENERATOR = REPO / "csrc" / "gen_cffi.py"
MODULE_FILE = f"{cdef_module.MODULE_NAME}.py"


def _declarations() -> str:
    return _native.cdef_source(_native._find_header().read_text())


def _generate(folder: Path) -> Path:
    subprocess.run([sys.executable, str(GENERATOR), str(_native._find_header()), str(folder)],
                   check=True, capture_output=True)
    return folder / MODULE_FILE


def _parsed():
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(_declarations())
    return ffi


def _signature(ffi, lib) -> dict[str, object]:
    """Every name the binding has, and what it is: each function's C type, each
    constant's value, each type's size."""
    def size(ctype: str) -> object:
        try:   # (not ctype.fields: prebuilt cffi aborts on an opaque struct's)
            return ffi.sizeof(ctype)
        except Exception:   # an opaque struct (a handle's); the two FFIs raise two types
            return "opaque"

    out: dict[str, object] = {}
    for name in dir(lib):
        value = getattr(lib, name)
        # prebuilt names a typedef'd enum by its tag ("enum orion_status"), parsed by its
        # typedef ("orion_status"): the header gives both the same name
        out[name] = value if isinstance(value, int) else re.sub(
            r"\b(enum|struct) ", "", ffi.typeof(value).cname)
    typedefs, structs, unions = ffi.list_types()
    for name in typedefs:
        kind = ffi.typeof(name).kind
        out[f"typedef {name}"] = kind if kind in ("function", "void") else size(name)
    for name in structs:
        out[f"struct {name}"] = size(f"struct {name}")
    for name in unions:
        out[f"union {name}"] = size(f"union {name}")
    return out


def test_prebuilt_declarations_equal_the_parsed_header(tmp_path):
    prebuilt = _native._prebuilt_ffi(_generate(tmp_path).with_name("liborion.so"),
                                     _declarations())
    assert prebuilt is not None
    parsed = _parsed()
    library = str(_native.LIBRARY_PATH)
    expected = _signature(parsed, parsed.dlopen(library))
    assert len(expected) > 60
    assert _signature(prebuilt, prebuilt.dlopen(library)) == expected


def test_a_stale_or_damaged_module_is_not_used(tmp_path):
    module = _generate(tmp_path)
    library = module.with_name("liborion.so")
    assert _native._prebuilt_ffi(library, _declarations()) is not None
    # made from other declarations: the header changed since the build
    assert _native._prebuilt_ffi(library, _declarations() + "\nint orion_new_call(void);") \
        is None
    module.write_text(module.read_text().replace(cdef_module.DIGEST_NAME, "OTHER_NAME"))
    assert _native._prebuilt_ffi(library, _declarations()) is None
    module.write_text("this is not python(")
    assert _native._prebuilt_ffi(library, _declarations()) is None
    module.unlink()
    assert _native._prebuilt_ffi(library, _declarations()) is None


def test_bindings_say_which_declarations_this_process_uses():
    fresh = _native._prebuilt_ffi(_native.LIBRARY_PATH, _declarations()) is not None
    assert _native.BINDINGS == ("prebuilt" if fresh else "parsed")


@pytest.mark.parametrize("prebuilt", [True, False])
def test_import_with_prebuilt_declarations_loads_no_parser(tmp_path, prebuilt):
    """A library with a fresh module beside it: `import orion` uses it and never imports
    pycparser; without one, the header is parsed (and orion still works)."""
    shutil.copy(_native.LIBRARY_PATH, tmp_path / _native.LIBRARY_PATH.name)
    if prebuilt:
        _generate(tmp_path)
    probe = ("import json, sys, orion; from orion.runtime import _native; "
             "print(json.dumps([_native.BINDINGS, 'pycparser' in sys.modules, "
             "orion.backends()]))")
    env = {**os.environ, "ORION_LIBRARY": str(tmp_path / _native.LIBRARY_PATH.name)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    bindings, parser_loaded, backends = json.loads(out.stdout.splitlines()[-1])
    assert bindings == ("prebuilt" if prebuilt else "parsed")
    assert parser_loaded is not prebuilt
    assert "vane" in backends


def test_the_generator_refuses_a_header_without_the_region(tmp_path):
    header = tmp_path / "orion.h"
    header.write_text("int orion_version(void);\n")
    run = subprocess.run([sys.executable, str(GENERATOR), str(header), str(tmp_path)],
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "ORION_CDEF_BEGIN" in run.stderr
    assert not (tmp_path / MODULE_FILE).exists()
