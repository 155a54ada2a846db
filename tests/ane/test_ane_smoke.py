"""benchmarks/ane_smoke.py's logic against the stand-in framework, in the stand-in's mode
(ANE_STANDIN_MODE; tests/ane/build_standin.sh runs this file once per mode). The stand-in
compiles slowly on purpose (ANE_STANDIN_COMPILE_MS) so that a compile hidden in a load
shows in its time, as on the device. The script cannot run on a Mac here; what it
concludes from each mode's behaviour is pinned instead."""

from __future__ import annotations

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

# What each raw variant does on each mode of the stand-in; the backend's paths (auto,
# recompile) agree with vane in every mode.
EXPECTED = {
    "observed": {"files": "no_effect", "data": "no_effect", "atomic": "no_effect",
                 "purge": "no_effect", "descriptor": "ok"},
    "verify": {"files": "error", "data": "error", "atomic": "error", "purge": "error",
               "descriptor": "ok"},
    "permissive": {"files": "ok", "data": "no_effect", "atomic": "ok", "purge": "ok",
                   "descriptor": "error"},
}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    if not os.environ.get("ORION_ANE_FRAMEWORK") or "ane" not in backends():
        pytest.skip(f"the ane backend on the stand-in is not loaded here ({WHERE})")
    out = tmp_path_factory.mktemp("smoke") / "report.json"
    env = child_env(ANE_STANDIN_COMPILE_MS="200")
    env.pop("ORION_BACKEND", None)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ane_smoke.py"), "--out",
                          str(out), "--skip-gpt2"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.exists(), run.stderr
    return run, json.loads(out.read_text())


def test_backend_paths_agree_with_vane(smoke):
    _, report = smoke
    assert report["basics"]["result"] == "ok", report["basics"]
    assert report["basics"]["binding_order_sorted"]
    for name in ("auto", "recompile"):
        assert report["variants"][name]["result"] == "ok", report["variants"][name]
    assert report["multi_entry"]["result"] == "ok", report["multi_entry"]
    assert report["inputs"]["result"] == "ok" and report["inputs"]["compiles_counted"] == 0
    for u in report["variants"]["recompile"]["updates"]:
        assert u["compiles_counted"] == 1   # a new descriptor, counted
    mode = os.environ.get("ANE_STANDIN_MODE", "observed")
    auto = [u["compiles_counted"] for u in report["variants"]["auto"]["updates"]]
    assert auto == ([0, 0] if mode == "permissive" else [1, 1])


def test_raw_variants_and_exit_status(smoke):
    run, report = smoke
    mode = os.environ.get("ANE_STANDIN_MODE", "observed")
    got = {name: report["variants"][name]["result"] for name in RAW}
    assert got == EXPECTED[mode]
    if mode == "verify":
        assert "hash mismatch" in report["variants"]["files"]["updates"][0]["error"]
    # purgeCompiledModel makes the observed device compile at load, unseen by the counter:
    # the one failure the script must report there
    hidden = [name for name, rec in report["variants"].items() if rec["hidden_compile"]]
    assert hidden == (["purge"] if mode == "observed" else [])
    assert report["passed"] == (mode != "observed")
    assert run.returncode == (1 if mode == "observed" else 0), run.stdout + run.stderr
    assert ("FAIL purge: a hidden compile" in run.stdout) == (mode == "observed")


def test_system_record(smoke):
    _, report = smoke
    system = report["system"]
    assert system["ane"].startswith("ane: available")
    assert system["env"]["ORION_ANE_FRAMEWORK"] == os.environ["ORION_ANE_FRAMEWORK"]


def test_gpt2_layer_at_real_size_matches_vane():
    if not os.environ.get("ORION_ANE_FRAMEWORK") or "ane" not in backends():
        pytest.skip(f"the ane backend on the stand-in is not loaded here ({WHERE})")
    record = _import_smoke().gpt2_layer()
    assert record["shape"]["n_embd"] == 768 and record["agrees_at_compile"]
    assert record["result"] == "ok", record


def _import_smoke():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ane_smoke
    finally:
        sys.path.pop(0)
    return ane_smoke


def _report(**override) -> dict:
    ok = {"result": "ok", "hidden_compile": False, "agrees_at_compile": True, "updates": []}
    report = {"basics": dict(ok), "variants": {v: dict(ok) for v in RAW + ("auto", "recompile")},
              "multi_entry": dict(ok), "inputs": dict(ok), "gpt2_layer": dict(ok)}
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
    ({"variants.auto.result": "no_effect"}, "variant auto: no_effect"),
    ({"variants.recompile.result": "wrong"}, "variant recompile: wrong"),
    ({"gpt2_layer.result": "wrong"}, "gpt2_layer: wrong"),
    ({"inputs.result": "wrong"}, "inputs: wrong"),
    ({"basics.result": "wrong"}, "basics: wrong"),
    ({"variants.purge.hidden_compile": True}, "purge: a hidden compile"),
    ({"multi_entry.agrees_at_compile": False}, "multi_entry: disagrees with vane"),
])
def test_what_fails_the_exit_status(override, failure):
    """The script's verdict, on reports no device produced: a backend path that is not
    ok, a hidden compile anywhere, or a disagreement right after compile."""
    got = _import_smoke().failures(_report(**override))
    if failure is None:
        assert got == []
    else:
        assert len(got) == 1 and got[0].startswith(failure), got
