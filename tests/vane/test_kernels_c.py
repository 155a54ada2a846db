"""Builds and runs tests/c/test_kernels.c against csrc/vane/kernels*.c.

The C program checks every kernel path the CPU has (forced in turn) against
the scalar path and against double-precision references; see its header.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(str(p) for p in (ROOT / "csrc" / "vane").glob("kernels*.c"))
TEST_C = ROOT / "tests" / "c" / "test_kernels.c"

pytestmark = pytest.mark.native


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler on PATH (cc, gcc or clang) to build tests/c/test_kernels.c; "
                    "runs in CI")
    return cc


def _build(tmp_path: Path, *flags: str) -> Path:
    exe = tmp_path / "test_kernels"
    cmd = [
        _compiler(),
        "-std=gnu11",
        "-pthread",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-unused-parameter",
        "-fno-strict-aliasing",
        *flags,
        "-I",
        str(ROOT / "csrc"),
        str(TEST_C),
        *SOURCES,
        "-lm",
        "-o",
        str(exe),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{res.stderr}"
    return exe


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ORION_VANE_ISA"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("kernels"), "-O2")


@pytest.mark.slow
def test_kernels_all_paths(exe: Path):
    res = subprocess.run([str(exe)], capture_output=True, text=True, env=_env(), timeout=120)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert " 0 failures" in res.stdout


def test_isa_environment_variable(exe: Path):
    best = subprocess.run([str(exe), "--isa"], capture_output=True, text=True, env=_env())
    assert best.returncode == 0
    assert best.stdout.strip() in {"avx512", "avx2", "neon", "scalar"}
    forced = subprocess.run(
        [str(exe), "--isa"], capture_output=True, text=True, env=_env(ORION_VANE_ISA="scalar")
    )
    assert forced.stdout.strip() == "scalar"
    # a name the CPU cannot honour falls back to the best path
    bogus = subprocess.run(
        [str(exe), "--isa"], capture_output=True, text=True, env=_env(ORION_VANE_ISA="no-such-isa")
    )
    assert bogus.stdout.strip() == best.stdout.strip()
