"""benchmarks/ane_smoke.py's conclusions against the stand-in framework, in the stand-in's
mode (ANE_STANDIN_MODE; tests/ane/build_standin.sh runs this file once per mode). The
stand-in compiles slowly on purpose (ANE_STANDIN_COMPILE_MS) so that a compile inside a
load shows in its time, as on the device. The script cannot run on a Mac here; what it
concludes from each mode's behaviour, and its exit status, are pinned instead."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_process import child_env

from orion.runtime import backends

pytestmark = pytest.mark.native

ROOT = Path(__file__).resolve().parents[2]
WHERE = "runs in .ci/run via tests/ane/build_standin.sh (ane backend built against the stand-in)"
RAW = ("files", "data", "atomic", "purge", "descriptor")
MODE = os.environ.get("ANE_STANDIN_MODE", "observed")

# What each raw variant does in each mode of the stand-in; the backend's paths (auto,
# recompile) agree with vane in every mode.
VERIFIES = {"files": "error", "data": "error", "atomic": "error", "purge": "error",
            "descriptor": "ok"}
EXPECTED = {
    "observed": {"files": "no_effect", "data": "no_effect", "atomic": "no_effect",
                 "purge": "no_effect", "descriptor": "ok"},
    "verify": VERIFIES,
    "macos27": VERIFIES,
    "permissive": {"files": "ok", "data": "no_effect", "atomic": "ok", "purge": "ok",
                   "descriptor": "error"},
    "compile-on-miss": {"files": "ok", "data": "no_effect", "atomic": "ok", "purge": "ok",
                        "descriptor": "ok"},
}
# The raw variants whose reloads compiled, which the backend counted by their time.
# (compile-on-miss: aned keeps what `files` compiled, for the same identifier and
# weights, so `atomic`'s reloads hit its cache; purgeCompiledModel drops it again.)
LOADS_COMPILE = {"observed": ["purge"], "compile-on-miss": ["files", "purge"]}
# Compiles counted for the two updates through `auto`: the canary's probe, then a
# recompile where the delta did not prove itself (compile-on-miss: the canary's reload
# compiled, counted as well).
AUTO = {"permissive": [0, 0], "compile-on-miss": [2, 1]}


def _smoke(tmp: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp / "report.json"
    environ = child_env(ANE_STANDIN_COMPILE_MS="200", **env)
    environ.pop("ORION_BACKEND", None)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ane_smoke.py"), "--out",
                          str(out), "--skip-gpt2", *args], env=environ, capture_output=True,
                         text=True, timeout=600)
    assert out.exists(), run.stdout + run.stderr
    return run, json.loads(out.read_text())


def _need_standin() -> None:
    if not os.environ.get("ORION_ANE_FRAMEWORK") or "ane" not in backends():
        pytest.skip(f"the ane backend on the stand-in is not loaded here ({WHERE})")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    _need_standin()
    return _smoke(tmp_path_factory.mktemp("smoke"), "--standin")


def test_backend_paths_agree_with_vane(smoke):
    run, report = smoke
    assert report["basics"]["result"] == "ok", report["basics"]
    assert report["basics"]["binding_order_sorted"]
    for name in ("auto", "recompile"):
        assert report["variants"][name]["result"] == "ok", report["variants"][name]
    assert report["multi_entry"]["result"] == "ok", report["multi_entry"]
    assert report["inputs"]["result"] == "ok" and report["inputs"]["compiles_counted"] == 0
    layers = report["layer_programs"]   # one program of 4 layers against 4 of one
    assert layers["result"] == "ok" and layers["max_err_vs_chained"] == 0, layers
    assert {"dispatch_ms_per_program", "ms_per_layer"} <= set(layers)
    batch = report["batched_decode"]   # the batch programs pass the stand-in's checks
    assert batch["result"] == "ok", batch
    assert [b["rows"] for b in batch["batches"]] == [1, 4, 8, 16, 32]
    for b in batch["batches"]:   # the stand-in computes with vane: the same bits
        assert b["result"] == "ok" and b["max_err_vs_vane"] == 0, b
        assert b["device_time"]["offered"] == (MODE != "macos27"), b
    packs = report["prompt_packs"]   # and the prompt packs, to vane's bits
    assert packs["result"] == "ok", packs
    assert [(k["rows"], k["prompts"]) for k in packs["packs"]] == [(4, 8), (8, 4), (16, 2)]
    for k in packs["packs"]:
        assert k["max_err_vs_vane"] == 0 and k["max_err_vs_verify"] == 0, k
        assert k["device_time"]["offered"] == (MODE != "macos27"), k
    assert "prompt packs: ok" in run.stdout and "    K 16, G 2: ok" in run.stdout
    for u in report["variants"]["recompile"]["updates"]:
        assert u["compiles_counted"] == 1   # a new descriptor, counted
    auto = [u["compiles_counted"] for u in report["variants"]["auto"]["updates"]]
    assert auto == AUTO.get(MODE, [1, 1])
    path = report["variants"]["auto"]["updates"][-1]["update_path"]
    assert path.startswith("delta: proven" if MODE == "permissive" else "recompile: "), path


def test_raw_variants_are_reported_and_compiles_counted(smoke):
    run, report = smoke
    got = {name: report["variants"][name]["result"] for name in RAW}
    assert got == EXPECTED[MODE]
    if MODE in ("verify", "macos27"):
        assert "hash mismatch" in report["variants"]["files"]["updates"][0]["error"]
    compiled = [name for name in RAW
                if any(u.get("load_compiled") for u in report["variants"][name]["updates"])]
    assert compiled == LOADS_COMPILE.get(MODE, [])
    for name in compiled:   # counted, so never a compile the backend missed
        assert all(u["compiles_counted"] >= 1 for u in report["variants"][name]["updates"])
    for name in EXPECT_COMPILE:
        assert report["variants"][name]["expect"] == "compile"
        assert f"{name:>10}: " in run.stdout and "(compiles by design)" in run.stdout
    assert not any(rec["missed_compile"] for rec in report["variants"].values())


EXPECT_COMPILE = ("purge", "descriptor")


def test_layouts_one_file_everywhere_two_files_refused_on_macos27(smoke):
    _, report = smoke
    layouts = report["layouts"]
    assert layouts["one_file"]["result"] == "ok"
    if MODE == "macos27":
        assert layouts["two_files"]["result"] == "error"
        assert "hash mismatch" in layouts["two_files"]["error"]
    else:
        assert layouts["two_files"]["result"] == "ok"


def test_device_time_is_read_where_offered(smoke):
    _, report = smoke
    device = report["basics"]["device_time"]
    if MODE == "macos27":   # the request refuses a stats object there (pmetal)
        assert not device["offered"] and "refused a stats object" in device["why"]
    else:
        assert device["offered"] and device["reported"] == device["evals"] == 20


def test_exit_status_with_standin(smoke):
    run, report = smoke
    assert report["judged"] and report["passed"], report["failures"]
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("PASSED")
    assert report["system"]["standin"] and report["system"]["ane"].startswith("ane: available")
    assert report["system"]["env"]["ORION_ANE_FRAMEWORK"] == os.environ["ORION_ANE_FRAMEWORK"]


def test_a_standin_is_never_reported_passed_without_the_flag(tmp_path):
    _need_standin()
    if MODE != "observed":
        pytest.skip("the flag's effect does not depend on the mode: runs in the observed mode")
    run, report = _smoke(tmp_path)
    assert run.returncode == 3 and not report["passed"] and not report["judged"]
    assert "NOT JUDGED" in run.stdout and "PASSED" not in run.stdout


def test_a_device_time_of_zero_fails_the_run(tmp_path):
    _need_standin()
    if MODE != "observed":
        pytest.skip("the device time does not depend on the mode: runs in the observed mode")
    run, report = _smoke(tmp_path, "--standin", ANE_STANDIN_HW_TIME="0")
    assert run.returncode == 1, run.stdout
    assert report["failures"] == ["basics: device time: the framework offers "
                                  "_ANEPerformanceStats but 20 of 20 evals report 0 ns"]


def test_gpt2_layer_at_real_size_matches_vane():
    _need_standin()
    record = _import_smoke().gpt2_layer()
    assert record["shape"]["n_embd"] == 768 and record["agrees_at_compile"]
    assert record["weight_files"] == 1
    assert record["result"] == "ok", record


def _import_smoke():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ane_smoke
    finally:
        sys.path.pop(0)
    return ane_smoke


def _report(**override) -> dict:
    ok = {"result": "ok", "missed_compile": False, "agrees_at_compile": True, "updates": []}
    report = {"basics": {**ok, "device_time": {"offered": True, "zero": 0, "evals": 20}},
              "variants": {v: dict(ok) for v in RAW + ("auto", "recompile")},
              "multi_entry": dict(ok), "inputs": dict(ok), "gpt2_layer": dict(ok),
              "layouts": {"one_file": {"result": "ok"}, "two_files": {"result": "ok"}}}
    for path, value in override.items():
        *keys, last = path.split(".")
        node = report
        for k in keys:
            node = node[k]
        node[last] = value
    return report


@pytest.mark.parametrize(("override", "failure"), [
    ({}, None),
    ({"variants.files.result": "no_effect"}, None),            # raw variants are reported only
    ({"layouts.two_files.result": "error"}, None),             # a refusal is allowed (macOS 27)
    ({"basics.device_time": {"offered": False, "why": "x"}}, None),   # not offered: reported
    ({"variants.auto.result": "no_effect"}, "variant auto: no_effect"),
    ({"variants.recompile.result": "wrong"}, "variant recompile: wrong"),
    ({"gpt2_layer.result": "wrong"}, "gpt2_layer: wrong"),
    ({"inputs.result": "wrong"}, "inputs: wrong"),
    ({"batched_decode": {"result": "wrong"}}, "batched_decode: wrong"),
    ({"prompt_packs": {"result": "error"}}, "prompt_packs: error"),
    ({"basics.result": "wrong"}, "basics: wrong"),
    ({"layouts.one_file.result": "error"}, "layouts: one weight file: error"),
    ({"layouts.two_files.result": "wrong"}, "layouts: two weight files: wrong numbers"),
    ({"basics.device_time.zero": 3}, "basics: device time: the framework offers"),
    ({"variants.files.missed_compile": True}, "files: a compile the backend missed"),
    ({"multi_entry.agrees_at_compile": False}, "multi_entry: disagrees with vane"),
])
def test_what_fails_the_exit_status(override, failure):
    """The script's verdict, on reports no device produced: a backend path or the one-file
    layout that is not ok, wrong numbers anywhere, a compile the backend missed, or a
    device time of 0 where the framework offers one."""
    got = _import_smoke().failures(_report(**override))
    if failure is None:
        assert got == []
    else:
        assert len(got) == 1 and got[0].startswith(failure), got


def test_compressed_formats_run_on_vane_smaller_than_fp16():
    """The per-format case a Mac owner runs (the script's `compressed`), here with vane as
    the backend: every format Orion emits compiles, runs and holds fewer bytes than
    fp16. (Whether the device agrees with vane is learned on a Mac only: here both
    sides are vane.)"""
    smoke = _import_smoke()
    report = smoke.compressed(evals=1, backend="vane")   # its size: no IO packing
    assert set(report) == {"fp16", "mlx_4bit_g64", "q4_0_g32", "q8_0_g32", "int8_per_channel",
                           "affine_int8", "lut4_per_16_channels",
                           "lut4_per_16_channels_scaled", "lut2_g64"}
    for name, rec in report.items():
        assert rec["result"] == "ok" and rec["vs_fp16"] > 0, (name, rec)
        if name != "fp16":
            assert rec["weight_bytes"] < report["fp16"]["weight_bytes"], (name, rec)


def test_batched_decode_runs_on_vane():
    """The batched-decode case a Mac owner runs (the script's `batched_decode`), here
    with vane as the backend, at its real size (a GPT-2 small layer, B = 1 to 32 against
    256-row caches): every B compiles, runs and agrees with vane to the bit; slot 0's
    column agrees with B = 1's to fp16 rounding (vane sums a 1-column conv in another
    order); the figures a Mac reports are there. (Whether the device agrees with vane,
    and what a column costs it, is learned on a Mac only.)"""
    report = _import_smoke().batched_decode(evals=2, backend="vane")
    assert report["result"] == "ok", report
    assert report["shape"] == {"n_embd": 768, "n_head": 12, "cache": 256}
    assert [b["rows"] for b in report["batches"]] == [1, 4, 8, 16, 32]
    for b in report["batches"]:
        assert b["result"] == "ok" and b["max_err_vs_vane"] == 0, b
        assert b["max_err_vs_b1"] < 1e-3, b
        assert b["ms_per_column"] == pytest.approx(b["eval_ms"] / b["rows"], abs=1e-4)
        assert b["vs_b1"] > 0 and not b["device_time"]["offered"]
    assert report["batches"][0]["vs_b1"] == 1


def test_prompt_packs_run_on_vane():
    """The prompt-pack case a Mac owner runs (the script's `prompt_packs`), here with vane
    as the backend, at its real size (a GPT-2 small layer, 32 rows as 8 prompts of 4, as
    4 of 8 and as 2 of 16): each group's rows equal to the bit those of its prompt's own
    verify (no group reads another's) and those of vane's pack; the figures a Mac reports
    are there. (What a pack saves on the device is learned on a Mac only.)"""
    report = _import_smoke().prompt_packs(evals=2, backend="vane")
    assert report["result"] == "ok", report
    assert report["shape"] == {"n_embd": 768, "n_head": 12, "cache": 256}
    assert [(k["rows"], k["prompts"]) for k in report["packs"]] == [(4, 8), (8, 4), (16, 2)]
    for k in report["packs"]:
        assert k["max_err_vs_vane"] == 0 and k["max_err_vs_verify"] == 0, k
        assert k["vs_verifies"] == pytest.approx(k["pack_ms"] / k["verifies_ms"], abs=2e-3)
        assert not k["device_time"]["offered"]


@pytest.mark.parametrize(("text", "rows"), [("1,4,8,16,32", (1, 4, 8, 16, 32)), ("8", (8,)),
                                            ("0", ()), ("0,4", None), ("33", None),
                                            ("a", None), ("", None)])
def test_batch_rows_flag(text, rows):
    smoke = _import_smoke()
    if rows is None:
        with pytest.raises(argparse.ArgumentTypeError):
            smoke._batch_rows(text)
    else:
        assert smoke._batch_rows(text) == rows
