"""Builds tests/c/test_vane_plan.c against the library in use and runs it: the
planner's buffer reuse, aliases and refusals, checked below the verifier."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orion.runtime import _native

ROOT = Path(__file__).resolve().parents[2]
TEST_C = ROOT / "tests" / "c" / "test_vane_plan.c"

pytestmark = pytest.mark.native


def test_vane_planner_in_c(tmp_path: Path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler on PATH to build tests/c/test_vane_plan.c; runs in CI")
    lib = Path(_native.LIBRARY_PATH).resolve()
    exe = tmp_path / "test_vane_plan"
    cmd = [cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
           "-I", str(ROOT / "csrc"), str(TEST_C), str(lib), f"-Wl,-rpath,{lib.parent}",
           "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{built.stderr}"
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all checks passed" in res.stdout
