"""Builds and runs tests/c/test_mil.c, the C-level tests of the MIL front end, under
AddressSanitizer and UndefinedBehaviorSanitizer when the compiler has them.

The driver feeds the parser heap copies of exactly the text's length, every prefix
of a valid program and single-byte mutations of it, so a read past the end of the
text fails here even where the Python tests would not notice."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_C = ROOT / "tests" / "c" / "test_mil.c"
SOURCES = sorted(str(p) for p in (ROOT / "csrc" / "mil").glob("*.c")) + [
    str(ROOT / "csrc" / "core" / "error.c"),
    str(ROOT / "csrc" / "core" / "blobfile.c"),
    str(ROOT / "csrc" / "core" / "regular_file.c"),
]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]

pytestmark = pytest.mark.native


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler on PATH (cc, gcc or clang) to build tests/c/test_mil.c; "
                    "runs in CI")
    return cc


def _build(out: Path, flags: list[str]) -> subprocess.CompletedProcess:
    cmd = [_compiler(), "-std=gnu11", "-g", "-O1", "-Wall", "-Wextra", "-Wno-unused-parameter",
           "-fno-strict-aliasing", '-DORION_VERSION_STRING="test"', *flags,
           "-I", str(ROOT / "csrc"), str(TEST_C), *SOURCES, "-lm", "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.slow
def test_c_driver(tmp_path: Path):
    exe = tmp_path / "test_mil"
    res = _build(exe, SANITIZE)
    if res.returncode != 0:   # a compiler without the sanitizer runtimes: build plainly
        res = _build(exe, [])
    assert res.returncode == 0, f"build failed:\n{res.stderr}"
    # the driver's own leak checks stay on (the Python process is not instrumented)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=1")
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=300)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 failures" in run.stdout
