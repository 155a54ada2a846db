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

from orion.errors import (
    BackendUnavailableError,
    CompileBudgetError,
    EvalError,
    InvalidArgumentError,
    OrionError,
)
from orion.runtime import (
    Program,
    Surface,
    _native,
    backends,
    compile_budget,
    compile_count,
    describe_backend,
    set_compile_budget,
)
from orion.runtime.blob import blob_bytes

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


def test_live_columns_are_a_hint_the_device_does_not_take(standin, no_leaks):
    """The device computes the columns it pads anyway (ANE-C24): on ane the live-columns
    hint a verify or a batched step gives is checked and changes nothing."""
    a = np.random.default_rng(2).standard_normal((C, S)).astype(np.float16)
    b = np.random.default_rng(3).standard_normal((C, S)).astype(np.float16)
    with Program.compile(MIL, backend="ane") as p:
        p.set_live_columns(S, 2, 3)
        out = p.run({"in_a": a, "in_b": b})
        with pytest.raises(InvalidArgumentError, match="live columns: 0 from column 0 of 8"):
            p.set_live_columns(8, 0)
    np.testing.assert_array_equal(out["out_s"], (a + b).reshape(1, C, 1, S))
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


def _isolated_env(framework: str, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, ORION_ANE_FRAMEWORK=framework, **extra)
    env.pop("ORION_BACKEND", None)
    env.pop("ORION_TEST_BACKEND", None)
    return env


def _run_isolated(framework: str, code: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=_isolated_env(framework, extra),
                          capture_output=True, text=True, timeout=120)


def _spawn(code: str, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args],
                            env=_isolated_env(STANDIN, extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


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


DEVICE_CHECK = """
import orion
from orion.cli.doctor import report
print(orion.backends())
print(next(line for line in report() if "auto falls back to vane" in line))
"""


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"ANE_STANDIN_HAS_ANE": "0"}, "[_ANEDeviceInfo hasANE] says this Mac has no Neural"),
        ({"ANE_STANDIN_VM": "1"}, "this is a virtual machine"),
        ({"ANE_STANDIN_TRANSLATED": "1"}, "under Rosetta"),
        ({"ANE_STANDIN_MACOS": "14.6"}, "needs macOS 15 or later (its MIL targets func "
                                        "main<ios18>, the macOS 15 opset); this is macOS 14.6"),
    ],
)
def test_the_device_decides_availability_and_doctor_says_why(standin, env, why):
    """The classes resolve in a VM, under Rosetta, on an Intel Mac and on macOS 14
    too: availability comes from the device, and `auto` falls back to vane saying so."""
    result = _run_isolated(STANDIN, DEVICE_CHECK, **env)
    assert result.returncode == 0, result.stderr
    found, doctor = result.stdout.splitlines()
    assert found == "['vane']"
    assert doctor.startswith("  auto falls back to vane: ane is unavailable: ") and why in doctor
    assert STANDIN in doctor


def _two_files_program():
    w = np.full((1, C, 1, S), 1.0, np.float16)
    v = np.full((1, C, 1, S), 2.0, np.float16)
    mil = WEIGHTED.replace(
        f'        {_T} out_y = add(x = in_x, y = w)[name = string("out_y")];\n',
        f'        {_T} v = const()[name = string("v"), val = {_T}(BLOBFILE('
        'path = string("@model_path/weights/v.bin"), offset = uint64(64)))];\n'
        f'        {_T} s = add(x = in_x, y = w)[name = string("s")];\n'
        f'        {_T} out_y = add(x = s, y = v)[name = string("out_y")];\n')
    return mil, {KEY: blob_bytes({"w": w})[0], "@model_path/weights/v.bin": blob_bytes({"v": v})[0]}


def test_one_weight_file_per_program_passes_macos27(standin, no_leaks):
    """macOS 27 (pmetal) fails a program with several weight files at the bundle check;
    the old inference layout is refused there with the count named, while what
    orion.ir.mil emits (one file) runs in every mode."""
    from orion.ir import Graph, composites
    from orion.ir.legalize import legalize_graph, legalize_program
    from orion.ir.mil import emit
    from orion.ir.program import program_from_graph

    mil, files = _two_files_program()
    x = np.zeros((C, S), np.float16)
    if standin.mode() == "macos27":
        with pytest.raises(OrionError, match=r"2 weight files; macOS 27 verifies.*hash mismatch"):
            Program.compile(mil, files, backend="ane")
    else:
        with Program.compile(mil, files, backend="ane") as p:
            assert np.all(p.run({"in_x": x})["out_y"] == 3)
    rng = np.random.default_rng(0)
    g = Graph("one_file")
    h = g.input("x", (1, 256, 1, 64))
    for i in range(3):
        h = g.tanh(composites.linear(g, h, rng.standard_normal((256, 256)) / 16,
                                     rng.standard_normal(256), name=f"l{i}"))
    g.output("y", h)
    em = emit(legalize_program(program_from_graph(legalize_graph(g), "one_file")),
              share_weights=True)
    assert len(em.weights) == 1
    feeds = {em.inputs[0].name: rng.standard_normal(em.inputs[0].device_shape).astype(np.float16)}
    out = em.outputs[0].name
    with Program.compile(em.mil, em.weights, backend="ane") as a, \
            Program.compile(em.mil, em.weights, backend="vane") as v:
        np.testing.assert_allclose(a.run(feeds)[out], v.run(feeds)[out], atol=1e-3)


@pytest.mark.parametrize("hw", ["measured", "0"])
def test_device_time_is_read_where_offered(standin, no_leaks, monkeypatch, hw):
    monkeypatch.setenv("ORION_ANE_PERF_STATS", "1")
    if hw == "0":
        monkeypatch.setenv("ANE_STANDIN_HW_TIME", "0")
    with Program.compile(MIL, backend="ane") as p:
        assert not p.hw_time().offered   # no evaluation yet
        p.run({"in_a": np.ones((C, S)), "in_b": np.ones((C, S))})
        t = p.hw_time()
    if standin.mode() == "macos27":   # the request refuses a stats object there
        assert not t.offered and "the request refused a stats object" in t.why
    else:
        assert t.offered and (t.ns > 0 if hw == "measured" else t.ns == 0)


def test_update_path_and_stats_are_reported(standin, no_leaks):
    from orion.runtime import update_stats

    before = update_stats()
    with Program.compile(WEIGHTED, {KEY: _blob(1.0)}, backend="ane") as a:
        assert a.update_path.startswith("unproven")
        a.load()
        a.update_weights({KEY: {64: np.full((1, C, 1, S), 3.0, np.float16)}})
        assert np.all(a.run({"in_x": np.zeros((C, S))})["out_y"] == 3)
        path = a.update_path
    after = update_stats()
    assert after.canary_probes == before.canary_probes + 1
    if standin.mode() == "permissive":
        assert path.startswith("delta: proven by a canary probe")
    else:
        assert path.startswith("recompile: ") and after.demotions == before.demotions + 1


SHARED_FOLDER = f"""
import sys
import numpy as np
from orion.runtime import Program
blob = bytes.fromhex(sys.argv[1])
for _ in range(int(sys.argv[2])):
    with Program.compile({WEIGHTED!r}, {{{KEY!r}: blob}}, backend="ane") as p:
        assert np.all(p.run({{"in_x": np.zeros(({C}, {S}))}})["out_y"] == 1)
print("ok")
"""


def test_processes_sharing_a_temp_folder_never_lose_it(standin, tmp_path):
    """Programs of one MIL and weights share NSTemporaryDirectory()/<id> across the
    user's processes; entering and leaving it run under one per-user lock, so a
    process never finds its folder deleted by another (ORION_ANE_KEEP_TEMP=1 keeps
    each folder for the program's life, the longest overlap)."""
    env = {"ORION_ANE_KEEP_TEMP": "1", "TMP": str(tmp_path), "TMPDIR": str(tmp_path)}
    procs = [_spawn(SHARED_FOLDER, _blob(1.0).hex(), "8", **env) for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.strip() == "ok", err
    left = [p.name for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(
        ("orion-", "standin-aned"))]
    assert left == [], left   # the last one out removed it


def test_unavailable_error_type_from_this_process():
    # Wherever ane is unavailable, asking for it names why; where it is, this is moot.
    if "ane" in backends():
        pytest.skip("ane is available in this process; the refusal runs in processes without it "
                    "(the clean-process test above)")
    with pytest.raises(BackendUnavailableError, match="ane"):
        Program.compile(MIL, backend="ane")


def test_standin_is_not_in_the_package():
    package = Path(_native.__file__).resolve().parents[1]   # orion/
    assert not list(package.rglob("*Standin*")), "the stand-in must never ship"
