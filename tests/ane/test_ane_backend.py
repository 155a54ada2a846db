"""The ane backend from Python, on the stand-in framework (tests/ane_standin).

These run where the library was built with the ane backend and ORION_ANE_FRAMEWORK
names the stand-in: `.ci/run` does it through tests/ane/build_standin.sh, which
also runs the runtime tests (tests/test_runtime.py) with ORION_TEST_BACKEND=ane.
Elsewhere they skip, saying so. On a Mac the real framework is checked by
benchmarks/ane_smoke.py instead (the stand-in's control calls do not exist there).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cffi import FFI

from orion import _native
from orion.blob import blob_bytes
from orion.errors import BackendUnavailableError, CompileBudgetError, EvalError, OrionError
from orion.runtime import (
    Program,
    Surface,
    backends,
    compile_budget,
    compile_count,
    describe_backend,
    set_compile_budget,
)

pytestmark = pytest.mark.native

STANDIN = os.environ.get("ORION_ANE_FRAMEWORK", "")
HEADER = Path(__file__).resolve().parents[1] / "ane_standin" / "standin.h"
WHERE = "runs in .ci/run via tests/ane/build_standin.sh (ane backend built against the stand-in)"

C, S = 64, 384  # 49152-byte tensors: the device's minimum surface (ANE-C23)
_T = f"tensor<fp16, [1, {C}, 1, {S}]>"
MIL = (
    "program(1.3)\n"
    '[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, '
    '{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, '
    '{"coremltools-version", "9.0"}})]\n'
    "{\n"
    f"    func main<ios18>({_T} in_b, {_T} in_a) {{\n"
    f'        {_T} out_d = sub(x = in_a, y = in_b)[name = string("out_d")];\n'
    f'        {_T} out_s = add(x = in_a, y = in_b)[name = string("out_s")];\n'
    "    } -> (out_s, out_d);\n"
    "}\n"
)


@pytest.fixture(scope="module")
def standin():
    """The stand-in's control interface, from the very library the backend loaded."""
    if not STANDIN or "ane" not in backends():
        pytest.skip(f"the ane backend on the stand-in is not loaded here ({WHERE})")
    ffi = FFI()
    text = HEADER.read_text()
    decls = [line for line in text.splitlines()
             if line.startswith(("size_t ", "void ", "int ", "const char *"))]
    ffi.cdef("\n".join(decls))
    lib = ffi.dlopen(STANDIN)

    class Control:
        def log(self) -> str:
            n = lib.ane_standin_log(ffi.NULL, 0)
            buf = ffi.new("char[]", n + 1)
            lib.ane_standin_log(buf, n + 1)
            return ffi.string(buf).decode()

        def mode(self) -> str:
            return ffi.string(lib.ane_standin_mode()).decode()

        def violations(self) -> str:
            buf = ffi.new("char[]", 8192)
            n = lib.ane_standin_violations(buf, 8192)
            return f"{n}: {ffi.string(buf).decode()}" if n else ""

    control = Control()
    control.lib = lib
    yield control
    lib.ane_standin_clear_faults()


def test_ane_is_listed_first_and_described(standin):
    assert backends() == ["ane", "vane"]
    assert describe_backend("ane").startswith("ane: available: ")
    assert STANDIN in describe_backend("ane")


def test_program_runs_through_ane_in_binding_order(standin, no_leaks):
    a = np.random.default_rng(0).standard_normal((C, S)).astype(np.float16)
    b = np.random.default_rng(1).standard_normal((C, S)).astype(np.float16)
    standin.lib.ane_standin_log_clear()
    with Program.compile(MIL, backend="ane") as p:
        assert p.backend == "ane"
        out = p.run({"in_a": a, "in_b": b})
    np.testing.assert_array_equal(out["out_d"], (a - b).reshape(1, C, 1, S))
    np.testing.assert_array_equal(out["out_s"], (a + b).reshape(1, C, 1, S))
    log = standin.log()
    assert "inputs=2 outputs=2" in log and "evaluateWithQoS:options:request:error:] qos=21" in log
    assert standin.violations() == ""


def test_surfaces_are_iosurfaces_and_zero_copy(standin, no_leaks):
    live = standin.lib.ane_standin_live_surfaces()
    with Program.compile(MIL, backend="ane") as p, Surface.tensor(C, S) as sa, \
            Surface.tensor(C, S) as sb, Surface.tensor(C, S) as sd, Surface.tensor(C, S) as ss:
        assert standin.lib.ane_standin_live_surfaces() == live + 4
        p.load()
        sa.numpy(shape=(C, S))[...] = 3
        sb.numpy(shape=(C, S))[...] = 1
        diff = sd.numpy(shape=(C, S))
        p.eval([sa, sb], [sd, ss])   # the device reads and writes the numpy views' memory
        assert np.all(diff == 2)
        del diff
    assert standin.lib.ane_standin_live_surfaces() == live


WEIGHTED = (
    "program(1.3)\n"
    '[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, '
    '{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, '
    '{"coremltools-version", "9.0"}})]\n'
    "{\n"
    f"    func main<ios18>({_T} in_x) {{\n"
    f'        {_T} w = const()[name = string("w"), val = {_T}(BLOBFILE('
    'path = string("@model_path/weights/w.bin"), offset = uint64(64)))];\n'
    f'        {_T} out_y = add(x = in_x, y = w)[name = string("out_y")];\n'
    "    } -> (out_y);\n"
    "}\n"
)
KEY = "@model_path/weights/w.bin"


def _blob(value: float) -> bytes:
    data, offsets = blob_bytes({"w": np.full((1, C, 1, S), value, np.float16)})
    assert offsets == {"w": 64}
    return data


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest().upper()


def test_identifier_hashes_mil_weight_bytes_and_options(standin, no_leaks):
    """The identifier public reverse engineering shows, checked with hashlib: upper-case
    SHA256(MIL)_SHA256(4 zero bytes + weight data)_SHA256(options, none here)."""
    ids = []
    for value in (1.0, 2.0):
        standin.lib.ane_standin_log_clear()
        with Program.compile(WEIGHTED, {KEY: _blob(value)}, backend="ane"):
            ids.append(re.findall(r"identifier (\S+)", standin.log())[-1])
    if standin.mode() == "permissive":   # the old belief, kept as a named mode
        assert ids[0] == ids[1] and re.fullmatch(r"[0-9a-f]{60}", ids[0])
        return
    want = [f"{_sha(WEIGHTED.encode())}_{_sha(bytes(4) + _blob(v))}_{_sha(b'')}"
            for v in (1.0, 2.0)]
    assert ids == want


def test_surface_host_access_is_locked(standin, no_leaks):
    with Program.compile(MIL, backend="ane") as p, Surface.tensor(C, S) as s:
        locks = standin.lib.ane_standin_locks()
        s.write(np.ones((C, S)))
        assert standin.lib.ane_standin_locks() == locks + 1
        assert np.all(s.read((C, S)) == 1)
        assert standin.lib.ane_standin_locks() == locks + 2
        p.load()
        locks = standin.lib.ane_standin_locks()
        p.run({"in_a": np.ones((C, S)), "in_b": np.ones((C, S))})
        # each input written and each output read under one lock
        assert standin.lib.ane_standin_locks() - locks >= 4
    assert standin.violations() == ""


@pytest.mark.parametrize("policy", ["auto", "recompile"])
def test_delta_update_matches_vane_or_raises(standin, no_leaks, monkeypatch, policy):
    """In every stand-in mode a delta update on ane takes effect or raises; its outputs
    are compared with vane's after the same update, never stale."""
    monkeypatch.setenv("ORION_ANE_DELTA", policy)
    x = np.random.default_rng(2).standard_normal((C, S)).astype(np.float16)
    with Program.compile(WEIGHTED, {KEY: _blob(1.0)}, backend="ane") as a, \
            Program.compile(WEIGHTED, {KEY: _blob(1.0)}, backend="vane") as v:
        for value in (3.0, -2.0, 0.5):
            patch = {KEY: {64: np.full((1, C, 1, S), value, np.float16)}}
            v.update_weights(patch)
            spent = compile_count()
            a.update_weights(patch)
            np.testing.assert_array_equal(a.run({"in_x": x})["out_y"],
                                          v.run({"in_x": x})["out_y"])
            if policy == "recompile":
                assert compile_count() == spent + 1   # a new descriptor counts as a compile


def test_delta_without_budget_is_refused_naming_inputs(standin, no_leaks):
    with Program.compile(WEIGHTED, {KEY: _blob(1.0)}, backend="ane") as a:
        a.load()
        old = compile_budget()
        set_compile_budget(compile_count())
        try:
            patch = {KEY: {64: np.full((1, C, 1, S), 7.0, np.float16)}}
            if standin.mode() == "permissive":   # the canary proves the delta: no compile
                a.update_weights(patch)
                assert np.all(a.run({"in_x": np.zeros((C, S))})["out_y"] == 7)
            else:
                with pytest.raises(CompileBudgetError, match="update='inputs'"):
                    a.update_weights(patch)
        finally:
            set_compile_budget(old)


def test_compile_refused_with_nserror(standin, no_leaks):
    standin.lib.ane_standin_fail(b"compileWithQoS:options:error:", 1, 0)
    with pytest.raises(OrionError, match=r"compileWithQoS:options:error:\] failed: .*ANECCompile"):
        Program.compile(MIL, backend="ane")


def test_evaluation_failure_is_an_eval_error(standin, no_leaks):
    with Program.compile(MIL, backend="ane") as p:
        p.load()
        standin.lib.ane_standin_fail(b"evaluateWithQoS:options:request:error:", 1, 0)
        with pytest.raises(EvalError, match=r"evaluateWithQoS.*status=0x1d"):
            p.run({"in_a": np.zeros((C, S)), "in_b": np.zeros((C, S))})
        # the program is still usable after a failed evaluation
        out = p.run({"in_a": np.ones((C, S)), "in_b": np.ones((C, S))})
        assert np.all(out["out_s"] == 2)


def _run_isolated(framework: str, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ORION_ANE_FRAMEWORK=framework)
    env.pop("ORION_BACKEND", None)
    env.pop("ORION_TEST_BACKEND", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


CHECK_UNAVAILABLE = f"""
import orion
from orion.errors import BackendUnavailableError
from orion.runtime import Program, describe_backend
assert orion.backends() == ["vane"], orion.backends()
print(describe_backend("ane"))
try:
    Program.compile({MIL!r}, backend="ane")
except BackendUnavailableError as e:
    print("refused:", e)
with Program.compile({MIL!r}) as p:
    print("auto:", p.backend)
"""


@pytest.mark.parametrize(
    ("variant", "why"),
    [
        ("libANEStandin_norequest.so", "class _ANERequest not found"),
        ("no-such-framework.so", "cannot load"),
    ],
)
def test_missing_class_or_framework_leaves_vane(standin, variant, why):
    framework = str(Path(STANDIN).with_name(variant))
    result = _run_isolated(framework, CHECK_UNAVAILABLE)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ane: unavailable: ") and why in lines[0]
    assert lines[1].startswith("refused: ") and why in lines[1]
    assert lines[2] == "auto: vane"


def test_unavailable_error_type_from_this_process():
    # Wherever ane is unavailable, asking for it names why; where it is, this is moot.
    if "ane" in backends():
        pytest.skip("ane is available in this process; the refusal runs in processes without it "
                    "(the clean-process test above)")
    with pytest.raises(BackendUnavailableError, match="ane"):
        Program.compile(MIL, backend="ane")


def test_standin_is_not_in_the_package():
    package = Path(_native.__file__).resolve().parent
    assert not list(package.rglob("*Standin*")), "the stand-in must never ship"
