"""Smoke test and numbers for the ane backend on a real Mac (docs/ane-backend.md).

    pip install . && python benchmarks/ane_smoke.py [--json report.json]

It checks, on the ane backend, what only hardware can confirm, each against vane
and a numpy reference: a 1x1 conv compiles, loads and evaluates; two inputs and two
outputs bind in sorted-name order (ANE-C19, C20); the delta path (unload, patch the
weight file in place, load) changes the result without a compile, which is the open
conflict of docs/ane-facts.md §4.2; and it times compile, load, eval, the delta
reload and a full recompile. It prints a report to paste into an issue. With
ORION_ANE_FRAMEWORK set (Linux CI's stand-in) it runs too, and says so: those
numbers are not the device's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from orion.blob import blob_bytes
from orion.runtime import Program, backends, compile_count, describe_backend

HEADER = (
    "program(1.3)\n"
    '[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, '
    '{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, '
    '{"coremltools-version", "9.0"}})]\n'
)
KEY = "@model_path/weights/w.bin"


def conv_mil(c: int, s: int) -> str:
    t = f"tensor<fp16, [1, {c}, 1, {s}]>"
    return HEADER + f"""{{
    func main<ios18>({t} in_x) {{
        string pt = const()[name = string("pt"), val = string("valid")];
        tensor<int32, [2]> st = const()[name = string("st"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, [4]> pd = const()[name = string("pd"), \
val = tensor<int32, [4]>([0, 0, 0, 0])];
        tensor<int32, [2]> dl = const()[name = string("dl"), val = tensor<int32, [2]>([1, 1])];
        int32 gr = const()[name = string("gr"), val = int32(1)];
        tensor<fp16, [{c}, {c}, 1, 1]> w = const()[name = string("w"), \
val = tensor<fp16, [{c}, {c}, 1, 1]>(BLOBFILE(path = string("{KEY}"), offset = uint64(64)))];
        {t} out_y = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, \
weight = w, x = in_x)[name = string("out_y")];
    }} -> (out_y);
}}
"""


def two_by_two_mil(c: int, s: int) -> str:
    t = f"tensor<fp16, [1, {c}, 1, {s}]>"
    return HEADER + f"""{{
    func main<ios18>({t} in_b, {t} in_a) {{
        {t} out_s = add(x = in_a, y = in_b)[name = string("out_s")];
        {t} out_d = sub(x = in_a, y = in_b)[name = string("out_d")];
    }} -> (out_s, out_d);
}}
"""


def weight_blob(w: np.ndarray) -> bytes:
    data, offsets = blob_bytes([("w", w.reshape(*w.shape, 1, 1))])
    assert offsets["w"] == 64
    return data


def ms(f: object, repeat: int = 1) -> float:
    """Median wall time of f() in milliseconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def max_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32))))


def run(channels: int, seq: int, evals: int) -> dict:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((channels, channels)) / np.sqrt(channels)).astype(np.float16)
    w2 = (rng.standard_normal((channels, channels)) / np.sqrt(channels)).astype(np.float16)
    x = rng.standard_normal((channels, seq)).astype(np.float16)
    ref1 = (w1.astype(np.float32) @ x.astype(np.float32)).astype(np.float16)
    ref2 = (w2.astype(np.float32) @ x.astype(np.float32)).astype(np.float16)
    r: dict = {}

    with Program.compile(conv_mil(channels, seq), {KEY: weight_blob(w1)}, backend="vane") as v:
        vane_y = v.run({"in_x": x})["out_y"].reshape(channels, seq)

    spent = compile_count()
    t0 = time.perf_counter()
    p = Program.compile(conv_mil(channels, seq), {KEY: weight_blob(w1)}, backend="ane")
    r["compile_ms"] = (time.perf_counter() - t0) * 1e3
    with p:
        r["load_ms"] = ms(p.load)
        ins, outs = p.surfaces()
        ins[0].numpy(np.float16, (channels, seq))[...] = x
        r["eval_ms_median"] = ms(lambda: p.eval(ins, outs), repeat=evals)
        y1 = outs[0].read((channels, seq))
        r["conv_max_err_vs_numpy"] = max_err(y1, ref1)
        r["conv_max_err_vs_vane"] = max_err(y1, vane_y)

        def delta() -> None:
            p.update_weights({KEY: {64: w2.reshape(channels, channels, 1, 1)}})

        r["delta_reload_ms"] = ms(delta)
        p.eval(ins, outs)
        y2 = outs[0].read((channels, seq))
        r["delta_max_err_vs_new_weights"] = max_err(y2, ref2)
        r["delta_changed_result"] = bool(max_err(y2, y1) > 0)
        r["delta_picks_up_new_weights"] = bool(r["delta_max_err_vs_new_weights"] < 0.05)
        r["delta_spent_no_compile"] = compile_count() == spent + 1
        for s in ins + outs:
            s.release()
    other = "@model_path/weights/w2.bin"
    t0 = time.perf_counter()
    with Program.compile(conv_mil(channels, seq).replace(KEY, other), {other: weight_blob(w2)},
                         backend="ane") as q:
        q.load()
        r["recompile_and_load_ms"] = (time.perf_counter() - t0) * 1e3
    r["delta_speedup_vs_recompile"] = r["recompile_and_load_ms"] / r["delta_reload_ms"]

    a = rng.standard_normal((64, 384)).astype(np.float16)
    b = rng.standard_normal((64, 384)).astype(np.float16)
    with Program.compile(two_by_two_mil(64, 384), backend="ane") as p2:
        out = p2.run({"in_a": a, "in_b": b})
    r["binding_order_sorted"] = bool(
        max_err(out["out_s"].reshape(64, 384), a + b) < 0.01
        and max_err(out["out_d"].reshape(64, 384), a - b) < 0.01
    )
    return r


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channels", type=int, default=512)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--evals", type=int, default=50)
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.channels * args.seq * 2 < 49152:
        parser.error("channels * seq * 2 must be at least 49152 bytes (ANE-C23)")
    header = {
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "macos": platform.mac_ver()[0] or None,
        "ane": describe_backend("ane"),
        "stand_in": os.environ.get("ORION_ANE_FRAMEWORK") or None,
        "shape": [1, args.channels, 1, args.seq],
    }
    print(json.dumps(header, indent=2))
    if "ane" not in backends():
        print("the ane backend is not available here; see `orion doctor`", file=sys.stderr)
        return 1
    if header["stand_in"]:
        print("NOTE: ORION_ANE_FRAMEWORK is set: these are the stand-in's numbers, not the "
              "device's", file=sys.stderr)
    report = {**header, **run(args.channels, args.seq, args.evals)}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    ok = (report["conv_max_err_vs_numpy"] < 0.05 and report["binding_order_sorted"]
          and report["delta_spent_no_compile"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
