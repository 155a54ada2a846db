"""Builds and runs tests/c/test_qkernels.c against csrc/vane/kernels*.c: the products
with compressed weights, every SIMD path the CPU has against an independent decoder
(see the C file's header)."""

import subprocess
from pathlib import Path

import pytest

from vane.test_kernels_c import ROOT, SOURCES, _compiler, _env

pytestmark = pytest.mark.native


@pytest.mark.slow
def test_quantized_kernels_all_paths(tmp_path: Path):
    exe = tmp_path / "test_qkernels"
    cmd = [_compiler(), "-std=gnu11", "-pthread", "-Wall", "-Wextra", "-Werror",
           "-Wno-unused-parameter", "-fno-strict-aliasing", "-O2", "-I", str(ROOT / "csrc"),
           str(ROOT / "tests" / "c" / "test_qkernels.c"), *SOURCES, "-lm", "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{built.stderr}"
    res = subprocess.run([str(exe)], capture_output=True, text=True, env=_env(), timeout=300)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert " 0 failures" in res.stdout
