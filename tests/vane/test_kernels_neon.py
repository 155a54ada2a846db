"""The aarch64 NEON kernels (csrc/vane/kernels_neon.c, kernels_quant_neon.c: vane's path
on an Apple CPU) built by a cross compiler and run under qemu's user-mode emulator:
tests/c/test_kernels.c and tests/c/test_qkernels.c check the NEON path against the
scalar one and the references as they do the x86 paths. qemu emulates the instructions,
so this proves results, not speed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vane.test_kernels_c import ROOT, SOURCES

pytestmark = [pytest.mark.native, pytest.mark.slow]
CROSS = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"


def _tools() -> tuple[str, str]:
    cc, qemu = shutil.which(CROSS), shutil.which(QEMU)
    if not cc or not qemu:
        pytest.skip(f"{CROSS} and {QEMU} are not installed (Debian: gcc-aarch64-linux-gnu "
                    "libc6-dev-arm64-cross qemu-user); runs in .ci/run, which installs them")
    return cc, qemu


@pytest.mark.parametrize("program", ["test_kernels", "test_qkernels"])
def test_neon_paths_under_qemu(program: str, tmp_path: Path):
    cc, qemu = _tools()
    exe = tmp_path / program
    cmd = [cc, "-std=gnu11", "-pthread", "-Wall", "-Wextra", "-Werror",
           "-Wno-unused-parameter", "-fno-strict-aliasing", "-O2", "-I", str(ROOT / "csrc"),
           str(ROOT / "tests" / "c" / f"{program}.c"), *SOURCES, "-lm", "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{built.stderr}"
    env = {k: v for k, v in os.environ.items() if k != "ORION_VANE_ISA"}
    env["QEMU_LD_PREFIX"] = SYSROOT
    res = subprocess.run([qemu, str(exe)], capture_output=True, text=True, env=env,
                         timeout=600)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    # the NEON path was the one checked, not only the scalar one
    assert ("best path: neon" if program == "test_kernels" else "paths: scalar neon") \
        in res.stdout, res.stdout
    assert " 0 failures" in res.stdout
