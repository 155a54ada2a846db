"""The ane backend's smoke test, for a Mac owner to run and send back (docs/ane-backend.md,
"Running on a Mac"):

    python benchmarks/ane_smoke.py --out ane_smoke.json

It checks what the backend believes about the device against what the device does:

- the basics: a 512-channel 1x1 conv against numpy and vane, two inputs and two outputs
  bound in sorted-name order (ANE-C19, C20), compile / load / eval timings, and the
  device's own execution time of every eval (`_ANEPerformanceStats`, ORION_ANE_PERF_STATS):
  proof that the Neural Engine ran the work, wherever the framework offers it;
- the weight layouts: one program's two tensors in two weight files (what inference
  emitted before) and in one file (what it emits now);
- each way of changing a compiled program's weights (ORION_ANE_DELTA), on one small
  program, against vane after the same change:
    files       weights/*.bin overwritten in place, then reload
    data        only the compiler's staging `data` file, in place
    atomic      weights/*.bin and `data` replaced by rename
    purge       in place, then purgeCompiledModel, then reload (the device compiles:
                expected)
    descriptor  a new descriptor with the new weights, loaded without compileWithQoS:
                (the device compiles at load: expected, and counted)
    auto        the backend's default: a canary-proven delta, else a counted recompile
    recompile   a new descriptor, compiled and counted
  each with its timings against a full compile, the compiles the budget counter saw
  (the backend counts a load that took a compile's time), the backend's own account of
  the update (`update_path`), and whether a load took compile time while the counter
  did not move (a compile the backend missed);
- a blob file with two entries (the training programs' layout), updated through `auto`;
- weights as program inputs (the `inputs` training strategy): no compile per update;
- one GPT-2 layer at its real size (768 wide), against vane, and updated through `auto`;
- compressed weights: a 768-wide conv with its weight in each format Orion emits
  (docs/quantization.md: MLX 4-bit groups, GGUF Q4_0 / Q8_0 blocks, per-output-channel
  int8, LUT palettization), each against vane and timed against the same conv in fp16:
  whether the device takes it (ANE-C55/C56 are single reports), computes it right, and
  decompresses it on the fly (faster than fp16) or at load (about as fast). Reported,
  not judged: which formats work is what the run is for.
- layer programs (docs/planning.md): GPT-2 small decode layers (one token against a
  256-row cache) as one program of 4 layers and as 4 programs of one, each eval timed on
  the device: what one program's dispatch costs and what a layer costs, the figures the
  planner's weight bound per program rests on; the 4-layer program against vane and
  against the 4 one-layer programs chained;
- batched decode (orion.models.batch_programs, what BatchDecoder and serve's batching
  run): one GPT-2 small decode layer advancing B sequences a token each per eval
  (B = 1, 4, 8, 16, 32; each against its own 256-row cache), each B timed on the
  device and against vane, slot 0's column against B = 1's: what a column costs once a
  decode step pays for 32 (ANE-C24), the ratio batched serving rests on;
- prompt packs (what BatchDecoder.pack and serve's batching run for short prompts
  waiting together): one GPT-2 small layer taking 32 prompt rows as G prompts of K
  tokens (K = 4, 8, 16) in one eval, timed against the G verifies of K rows it replaces,
  each group's rows against vane's and against its own verify's.

Exit status: 0 when every judged check passes; 1 when one fails: the basics, the
backend's own paths (auto, recompile, the multi-entry blob, inputs, the GPT-2 layer,
the layer programs, batched decode, prompt packs)
disagreeing with vane or having no effect, the one-file layout failing, the two-file
layout computing wrong numbers (refusing it is allowed: macOS 27 does), a compile the
backend missed (outside the variants that compile by design), or a device time that is
0 where the framework offers one; 2 when the ane backend is not available; 3 when the
framework is not the system's (ORION_ANE_FRAMEWORK: a stand-in) and --standin was not
given: its numbers prove nothing about a device, so it never reports `passed`. Which raw
variants work is reported, not judged: that is what the run is for (the first `auto`
update of a program includes its canary, so its time is not judged either). One JSON
file records everything, with sw_vers, the chip and the AppleNeuralEngine framework
version. Off a Mac it runs against the stand-in framework (tests/ane/test_ane_smoke.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import plistlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from orion import __version__
from orion.errors import OrionError
from orion.runtime import Program, backends, compile_count, describe_backend, update_stats
from orion.runtime.blob import blob_bytes, read_blob

VARIANTS = ("files", "data", "atomic", "purge", "descriptor", "auto", "recompile")
BACKEND_PATHS = ("auto", "recompile")    # judged; the raw variants are only reported
EXPECT_COMPILE = ("purge", "descriptor")  # the device compiles for these by design
C, S = 64, 384                           # 49152-byte tensors: the device minimum (ANE-C23)
HIDDEN_SHARE = 0.5    # a load taking half a compile's time, uncounted, is a missed compile
REL_TOL = 2e-2        # device fp16 against vane fp16, of the largest output
FRAMEWORK = Path("/System/Library/PrivateFrameworks/AppleNeuralEngine.framework")
SYSTEM_FRAMEWORK = str(FRAMEWORK / "AppleNeuralEngine")
EXIT_PASSED, EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_STANDIN = 0, 1, 2, 3

_T = f"tensor<fp16, [1, {C}, 1, {S}]>"
_HEADER = (
    "program(1.3)\n"
    '[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, '
    '{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, '
    '{"coremltools-version", "9.0"}})]\n'
)


def _const(name: str, key: str, offset: int) -> str:
    return (f'        {_T} {name} = const()[name = string("{name}"), val = {_T}(BLOBFILE('
            f'path = string("{key}"), offset = uint64({offset})))];\n')


def _program(body: str, inputs: str, out: str) -> str:
    return _HEADER + f"{{\n    func main<ios18>({inputs}) {{\n{body}    }} -> ({out});\n}}\n"


# ---- measurements ---------------------------------------------------------------------


def _ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


def _close(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    for k in b:
        x, y = np.asarray(a[k], np.float32), np.asarray(b[k], np.float32)
        if not np.all(np.isfinite(x)) or np.max(np.abs(x - y)) > REL_TOL * max(
                float(np.max(np.abs(y))), 1e-3):
            return False
    return True


def _verdict(after: Mapping[str, np.ndarray], before: Mapping[str, np.ndarray],
             want: Mapping[str, np.ndarray]) -> str:
    if _close(after, want):
        return "ok"
    return "no_effect" if _close(after, before) else "wrong"


def _patches(old: Mapping[str, bytes], new: Mapping[str, bytes]) -> dict[str, dict[int, Any]]:
    """Every entry of every blob file of `new`, as update_weights takes them."""
    out: dict[str, dict[int, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, data in new.items():
            assert len(data) == len(old[key]), f"{key}: an update keeps every size"
            path = Path(tmp) / "blob.bin"
            path.write_bytes(data)
            out[key] = dict(read_blob(path))
    return out


def _update(mil: str, files: Mapping[str, bytes], updates: list[Mapping[str, bytes]],
            feeds: Mapping[str, np.ndarray], expect_compile: bool = False) -> dict[str, Any]:
    """Compiles on ane (timed) and vane, applies each update to both, compares after each.
    A missed compile: an update that takes half this program's compile time while the
    budget counter does not move; not judged where the device compiles by design, nor on
    the first update through `auto`, whose time includes the canary's evaluations on vane."""
    auto = os.environ.get("ORION_ANE_DELTA", "auto") == "auto"
    record: dict[str, Any] = {"updates": [], "expect": "compile" if expect_compile else "delta"}
    a, compile_ms = _ms(lambda: Program.compile(mil, files, backend="ane"))
    record["compile_ms"] = round(compile_ms, 3)
    with a, Program.compile(mil, files, backend="vane") as v:
        before = a.run(feeds)
        record["agrees_at_compile"] = _close(before, v.run(feeds))
        current = dict(files)
        for i, new in enumerate(updates):
            patch = _patches(current, new)
            v.update_weights(patch)
            want = v.run(feeds)
            spent, hidden = compile_count(), update_stats().hidden_compiles
            try:
                _, ms = _ms(lambda p=patch: a.update_weights(p))
            except OrionError as e:
                record["updates"].append({"result": "error", "error": str(e),
                                          "update_path": a.update_path})
                break
            counted = compile_count() - spent
            after = a.run(feeds)
            judged = not expect_compile and not (auto and i == 0)
            record["updates"].append({
                "result": _verdict(after, before, want), "update_ms": round(ms, 3),
                "compiles_counted": counted,
                "load_compiled": update_stats().hidden_compiles - hidden,
                "missed_compile": judged and counted == 0 and ms >= HIDDEN_SHARE * compile_ms,
                "update_path": a.update_path,
            })
            before, current = after, dict(new)
    results = [u["result"] for u in record["updates"]]
    record["result"] = next((r for r in results if r != "ok"), "ok") if results else "error"
    record["missed_compile"] = any(u.get("missed_compile") for u in record["updates"])
    return record


# ---- the cases ------------------------------------------------------------------------


def _single(rng: np.random.Generator) -> tuple[str, list[dict[str, bytes]]]:
    key = "@model_path/weights/w.bin"
    mil = _program(_const("w", key, 64) +
                   f'        {_T} out_y = add(x = in_x, y = w)[name = string("out_y")];\n',
                   f"{_T} in_x", "out_y")
    blobs = [{key: blob_bytes({"w": rng.standard_normal((1, C, 1, S)).astype(np.float16)})[0]}
             for _ in range(3)]
    return mil, blobs


def _multi(rng: np.random.Generator) -> tuple[str, list[dict[str, bytes]]]:
    key = "@model_path/weights/wb.bin"
    blobs = []
    for _ in range(3):
        data, offsets = blob_bytes({"s": rng.standard_normal((1, C, 1, S)).astype(np.float16),
                                    "b": rng.standard_normal((1, C, 1, S)).astype(np.float16)})
        blobs.append({key: data})
    body = (_const("s", key, offsets["s"]) + _const("b", key, offsets["b"]) +
            f'        {_T} m = mul(x = in_x, y = s)[name = string("m")];\n'
            f'        {_T} out_y = add(x = m, y = b)[name = string("out_y")];\n')
    return _program(body, f"{_T} in_x", "out_y"), blobs


def variants(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    mil, blobs = _single(rng)
    feeds = {"in_x": rng.standard_normal((C, S)).astype(np.float16)}
    out = {}
    for variant in VARIANTS:
        os.environ["ORION_ANE_DELTA"] = variant
        try:
            out[variant] = _update(mil, blobs[0], blobs[1:], feeds,
                                   expect_compile=variant in EXPECT_COMPILE)
        finally:
            del os.environ["ORION_ANE_DELTA"]
    return out


def multi_entry(seed: int = 1) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    mil, blobs = _multi(rng)
    feeds = {"in_x": rng.standard_normal((C, S)).astype(np.float16)}
    return _update(mil, blobs[0], blobs[1:], feeds)


def layouts(seed: int = 5) -> dict[str, Any]:
    """out = x * s + b with s and b in two weight files (what inference emitted before
    one file per program) and in one file (what it emits now), each against vane."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((1, C, 1, S)).astype(np.float16)
    b = rng.standard_normal((1, C, 1, S)).astype(np.float16)
    op = (f'        {_T} m = mul(x = in_x, y = s)[name = string("m")];\n'
          f'        {_T} out_y = add(x = m, y = b)[name = string("out_y")];\n')
    one_key, s_key, b_key = ("@model_path/weights/sb.bin", "@model_path/weights/s.bin",
                             "@model_path/weights/b.bin")
    one, offsets = blob_bytes({"s": s, "b": b})
    cases = {
        "one_file": (_program(_const("s", one_key, offsets["s"]) + _const("b", one_key,
                                                                            offsets["b"]) + op,
                              f"{_T} in_x", "out_y"), {one_key: one}),
        "two_files": (_program(_const("s", s_key, 64) + _const("b", b_key, 64) + op,
                               f"{_T} in_x", "out_y"),
                      {s_key: blob_bytes({"s": s})[0], b_key: blob_bytes({"b": b})[0]}),
    }
    feeds = {"in_x": rng.standard_normal((C, S)).astype(np.float16)}
    out: dict[str, Any] = {}
    for name, (mil, files) in cases.items():
        with Program.compile(mil, files, backend="vane") as v:
            want = v.run(feeds)
        try:
            with Program.compile(mil, files, backend="ane") as a:
                got = a.run(feeds)
            out[name] = {"result": "ok" if _close(got, want) else "wrong", "files": len(files)}
        except OrionError as e:
            out[name] = {"result": "error", "error": str(e), "files": len(files)}
    return out


def inputs_strategy(seed: int = 2) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    mil = _program(f'        {_T} out_y = add(x = in_x, y = in_w)[name = string("out_y")];\n',
                   f"{_T} in_x, {_T} in_w", "out_y")
    x = rng.standard_normal((C, S)).astype(np.float16)
    record: dict[str, Any] = {"updates": []}
    with Program.compile(mil, backend="ane") as a, Program.compile(mil, backend="vane") as v:
        spent = compile_count()
        for _ in range(3):
            feeds = {"in_x": x, "in_w": rng.standard_normal((C, S)).astype(np.float16)}
            got, ms = _ms(lambda f=feeds: a.run(f))
            record["updates"].append({"result": "ok" if _close(got, v.run(feeds)) else "wrong",
                                      "run_ms": round(ms, 3)})
        record["compiles_counted"] = compile_count() - spent
    ok = all(u["result"] == "ok" for u in record["updates"]) and record["compiles_counted"] == 0
    record["result"] = "ok" if ok else "wrong"
    return record


def gpt2_layer(seq: int = 32, seed: int = 3) -> dict[str, Any]:
    """One GPT-2 small layer (768 wide, 3072 inner), random weights, through `auto`."""
    from orion.ir.legalize import legalize_graph, legalize_program
    from orion.ir.mil import emit
    from orion.ir.program import program_from_graph
    from orion.models.architectures import gpt2
    from orion.models.blocks import Weights
    from orion.models.programs import prefill_graph
    from orion.models.weights import ArrayWeights

    def lower(g: Any) -> Any:
        """As orion.models.programs.lower, but with every tensor an entry of its own:
        a delta update patches the same offsets with new bytes."""
        return emit(legalize_program(program_from_graph(legalize_graph(g), g.name)))

    arch = gpt2.Model.from_config({"model_type": "gpt2"}, "GPT-2 small")
    d, f = arch.args.dim, arch.args.hidden_dim
    rng = np.random.default_rng(seed)

    def layer(scale: float) -> Weights:
        shapes = arch.layer_parameters(0)
        return Weights(ArrayWeights({
            arch.layer_prefix(0) + k: ((1.0 if k.endswith("ln_1.weight") or
                                        k.endswith("ln_2.weight") else 0.0)
                                       + rng.standard_normal(s) * scale).astype(np.float32)
            for k, s in shapes.items()}))

    programs = [lower(prefill_graph(arch, layer(0.02), 0, "gpt2_smoke", seq))
                for _ in range(3)]
    feeds = {io.name: rng.standard_normal(io.shape).astype(np.float16)
             for io in programs[0].inputs}
    record = _update(programs[0].mil, programs[0].weights, [p.weights for p in programs[1:]],
                     feeds)
    record["shape"] = {"n_embd": d, "d_ff": f, "seq": seq}
    record["weight_files"] = len(programs[0].weights)
    return record


def _timed_tokens(chain: list[tuple[Program, Mapping[str, np.ndarray]]], evals: int,
                  hw: list[Any] | None = None) -> tuple[list[list[np.ndarray]], float]:
    """Each program's outputs for its feeds, and the median time of `evals` rounds that
    evaluate the programs once each, in order, as a decode token does (so each
    round's weights come from memory, not from a cache the previous eval filled).
    Surfaces are made and filled once: the time is the evals' own. `hw`: gets the last
    program's device time (`Program.hw_time()`) after each round."""
    bound = [(p, *p.surfaces()) for p, _ in chain]
    try:
        for (p, ins, _), (_, feeds) in zip(bound, chain, strict=True):
            for io, surface in zip(p.inputs, ins, strict=True):
                with surface.cpu_access():
                    surface.numpy(np.float16, (int(np.prod(io.shape)),))[...] = \
                        feeds[io.name].ravel()
        times = []
        for _ in range(evals):
            t0 = time.perf_counter()
            for p, ins, outs in bound:
                p.eval(ins, outs)
            times.append(1e3 * (time.perf_counter() - t0))
            if hw is not None:
                hw.append(bound[-1][0].hw_time())
        results = [[s.read(io.shape, np.float16) for io, s in zip(p.outputs, outs, strict=True)]
                   for p, _, outs in bound]
        return results, statistics.median(times)
    finally:
        for _, ins, outs in bound:
            for s in ins + outs:
                s.release()


def layer_programs(layers: int = 4, cache: int = 256, evals: int = 20, seed: int = 6,
                   backend: str = "ane") -> dict[str, Any]:
    """GPT-2 small decode layers as one program of `layers` and as `layers` programs of
    one, on the device: the dispatch cost of a program is what the one-layer programs
    take together beyond the layers' program, over the programs it saves."""
    from orion.ir.composites import MASK_VALUE
    from orion.models import programs as P
    from orion.models.architectures import gpt2
    from orion.models.blocks import Weights
    from orion.models.plan import layer_weight_bytes
    from orion.models.weights import ArrayWeights, init_weights

    arch = gpt2.Model.from_config({"model_type": "gpt2", "n_layer": layers}, "GPT-2 small")
    weights = ArrayWeights(init_weights(arch, seed))
    emitted = [P.lower(P.decode_graph(arch, Weights(weights), range(layers), "smoke_layers",
                                      cache))]
    emitted += [P.lower(P.decode_graph(arch, Weights(weights), i, f"smoke_layer{i}", cache))
                for i in range(layers)]
    rng = np.random.default_rng(seed)
    x = np.zeros(emitted[0].inputs[0].device_shape, np.float16)
    rows, width = emitted[0].inputs[0].block
    x.reshape(x.shape[1], x.shape[3])[:rows, :width] = rng.standard_normal((rows, width))

    def feeds(em: Any, x: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        for io in em.inputs:
            a = np.zeros(io.device_shape[1:2] + io.device_shape[3:], np.float16)
            if io.source == "x":
                a = x.reshape(a.shape)
            elif io.source.startswith("mask"):
                a[: io.block[0], 0] = MASK_VALUE
                a[:16, 0] = 0   # the cache's first 16 rows (zeros) and the token itself
            out[io.name] = a.reshape(io.device_shape)
        return out

    def h_block(outs: list[np.ndarray]) -> np.ndarray:
        h = outs[0]
        return h.reshape(h.shape[1], h.shape[3])[:rows, :width].astype(np.float32)

    r: dict[str, Any] = {"layers": layers, "cache": cache, "evals": evals,
                         "weight_bytes_per_layer": layer_weight_bytes(arch, 0)}
    with Program.compile(emitted[0].mil, emitted[0].weights, backend="vane") as v:
        v.load()
        vane_h = h_block(_timed_tokens([(v, feeds(emitted[0], x))], 1)[0][0])
    programs, compile_ms = [], []
    try:
        for em in emitted:
            p, ms = _ms(lambda em=em: Program.compile(em.mil, em.weights, backend=backend))
            programs.append(p)
            compile_ms.append(ms)
            p.load()
        (multi,), multi_ms = _timed_tokens([(programs[0], feeds(emitted[0], x))], evals)
        chained = x
        for em, p in zip(emitted[1:], programs[1:], strict=True):   # each layer's h in turn
            (outs,), _ = _timed_tokens([(p, feeds(em, chained))], 1)
            chained = np.zeros_like(x)
            chained.reshape(x.shape[1], x.shape[3])[:rows, :width] = h_block(outs)
        _, singles_ms = _timed_tokens([(p, feeds(em, x)) for em, p in
                                       zip(emitted[1:], programs[1:], strict=True)], evals)
    finally:
        for p in programs:
            p.release()
    got = h_block(multi)
    scale = float(np.abs(vane_h).max()) or 1.0
    r["max_err_vs_vane"] = float(np.abs(got - vane_h).max()) / scale
    r["max_err_vs_chained"] = float(np.abs(got - h_block([chained])).max()) / scale
    r["compile_ms"] = {"layers_program": round(compile_ms[0], 1),
                       "one_layer_median": round(statistics.median(compile_ms[1:]), 1)}
    r["eval_ms"] = {"layers_program": round(multi_ms, 4),
                    "one_layer_programs": round(singles_ms, 4)}
    r["dispatch_ms_per_program"] = round((singles_ms - multi_ms) / (layers - 1), 4)
    r["ms_per_layer"] = round(multi_ms / layers, 4)
    ok = r["max_err_vs_vane"] < REL_TOL and r["max_err_vs_chained"] < REL_TOL
    r["result"] = "ok" if ok else "wrong"
    return r


BATCH_ROWS = (1, 4, 8, 16, 32)   # B: up to the 32 columns a decode step pays for (ANE-C24)


def _fold_feeds(em: Any, rows: int, blocks: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """A program's inputs from a block per source: x's `rows` rows each zero-padded to
    its fold, every block written at the top left of its surface; a source without a
    block stays zeros."""
    out = {}
    for io in em.inputs:
        a = np.zeros((io.device_shape[1], io.device_shape[3]), np.float16)
        r, w = io.block
        block = blocks.get(io.source)
        if block is not None:
            if io.source == "x":   # each row zero-padded to its R*W fold
                block = np.pad(block, ((0, 0), (0, r * w // rows - block.shape[1])))
            a[:r, :w] = block.reshape(r, w)
        out[io.name] = a.reshape(io.device_shape)
    return out


def _batch_feeds(em: Any, rows: int, slots: list[dict[str, np.ndarray]]
                 ) -> dict[str, np.ndarray]:
    """The batch program's inputs for slots 0..rows-1: slot b's x as folded rows after
    slot b-1's, slot b's cache rows after slot b-1's, slot b's mask after slot b-1's
    (orion.models.batch_programs)."""
    blocks = {"x": np.stack([s["x"] for s in slots[:rows]]),
              "mask": np.concatenate([s["mask"] for s in slots[:rows]])[:, None]}
    for name in ("k_cache", "v_cache"):
        blocks[name] = np.concatenate([s[name].ravel() for s in slots[:rows]])
    return _fold_feeds(em, rows, blocks)


def _batch_outputs(em: Any, outs: list[np.ndarray], rows: int, dim: int
                   ) -> dict[str, np.ndarray]:
    """h [B, D] (unfolded from its rows), then k_rows and v_rows [B, KVD], from the
    device's surfaces."""
    got = {}
    for io, a in zip(em.outputs, outs, strict=True):
        r, w = io.block
        block = a.reshape(io.device_shape[1], io.device_shape[3])[:r, :w].astype(np.float32)
        if io.source == "h_rows":
            got["h"] = block.reshape(rows, -1)[:, :dim]
        else:
            got[io.source] = block
    return got


def _worst(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    """The largest error over the outputs, each relative to its own largest value."""
    return max(float(np.abs(got[k] - want[k]).max()) / (float(np.abs(want[k]).max()) or 1.0)
               for k in want)


def _judge(rec: dict[str, Any], pairs: Mapping[str, tuple[Mapping[str, np.ndarray],
                                                          Mapping[str, np.ndarray]]]) -> None:
    """rec's `max_err_vs_<name>` for each (got, want) pair, and its result: `ok` when
    every one is within REL_TOL, else `wrong`."""
    for name, (got, want) in pairs.items():
        rec[f"max_err_vs_{name}"] = _worst(got, want)
    ok = all(rec[f"max_err_vs_{name}"] < REL_TOL for name in pairs)
    rec["result"] = "ok" if ok else "wrong"


def _layer_weights(arch: Any, rng: np.random.Generator) -> Any:
    """Layer 0's random weights: norms' gains near 1, the rest N(0, 0.02)."""
    from orion.models.blocks import Weights
    from orion.models.weights import ArrayWeights

    return Weights(ArrayWeights({
        arch.layer_prefix(0) + k: ((1.0 if k.startswith("ln_") and k.endswith(".weight")
                                    else 0.0) + rng.standard_normal(s) * 0.02
                                   ).astype(np.float32)
        for k, s in arch.layer_parameters(0).items()}))


def batched_decode(rows: tuple[int, ...] = BATCH_ROWS, cache: int = 256, evals: int = 20,
                   seed: int = 7, backend: str = "ane", config: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """One GPT-2 small decode layer as the batch program of B rows (orion.models.
    batch_programs, what BatchDecoder runs), for each B in `rows`: B sequences a token
    each in one eval, each against its own `cache`-row cache, random weights, caches
    and live lengths. Each B's eval is timed (and the device's own time read), and its
    rows checked against vane's; slot 0 is the same sequence at every B, so its
    row is also checked against B = 1's (no row reads another's). What to read: ms
    per eval against B = 1's (`vs_b1`): B tokens for the price of about one where the
    columns are padding anyway. `config`: overrides of GPT-2 small's (tests)."""
    from orion.ir.composites import MASK_VALUE
    from orion.models import programs as P
    from orion.models.architectures import gpt2
    from orion.models.batch_programs import batch_graph

    rows = tuple(sorted({1, *rows}))
    arch = gpt2.Model.from_config({"model_type": "gpt2", "n_layer": 1, **(config or {})},
                                  "GPT-2 small")
    a = arch.args
    rng = np.random.default_rng(seed)
    weights = _layer_weights(arch, rng)
    slots = []
    for b in range(rows[-1]):   # slot b: its token, cache and live length, at every B
        live = 1 + (17 * b + 5) % cache
        mask = np.full(cache, MASK_VALUE, np.float16)
        mask[:live] = 0
        kv = [np.zeros((a.n_kv_heads, cache, a.head_dim), np.float16) for _ in range(2)]
        for c in kv:
            c[:, :live] = rng.standard_normal((a.n_kv_heads, live, a.head_dim))
        slots.append({"x": rng.standard_normal(a.dim).astype(np.float16), "mask": mask,
                      "k_cache": kv[0], "v_cache": kv[1]})
    r: dict[str, Any] = {"shape": {"n_embd": a.dim, "n_head": a.n_heads, "cache": cache},
                         "evals": evals, "backend": backend, "batches": []}
    first: dict[str, np.ndarray] = {}
    for b in rows:
        em = P.lower(batch_graph(arch, weights, range(1), f"smoke_batch{b}", cache, b))
        feeds = _batch_feeds(em, b, slots)
        rec: dict[str, Any] = {"rows": b}
        with Program.compile(em.mil, em.weights, backend="vane") as v:
            v.load()
            want = _batch_outputs(em, _timed_tokens([(v, feeds)], 1)[0][0], b, a.dim)
        try:
            p, ms = _ms(lambda em=em: Program.compile(em.mil, em.weights, backend=backend))
            rec["compile_ms"] = round(ms, 1)
            hw: list[Any] = []
            with p:
                p.load()
                (outs,), eval_ms = _timed_tokens([(p, feeds)], evals, hw)
        except OrionError as e:
            rec.update(result="error", error=str(e))
            r["batches"].append(rec)
            continue
        got = _batch_outputs(em, outs, b, a.dim)
        col0 = {"h": got["h"][:1], "k_rows": got["k_rows"][:1], "v_rows": got["v_rows"][:1]}
        first = first or col0
        _judge(rec, {"vane": (got, want), "b1": (col0, first)})
        rec["eval_ms"] = round(eval_ms, 4)
        rec["ms_per_column"] = round(eval_ms / b, 4)
        rec["device_time"] = _device_time(hw)
        r["batches"].append(rec)
    base = r["batches"][0]
    for rec in r["batches"]:
        if "eval_ms" in rec and "eval_ms" in base:
            rec["vs_b1"] = round(rec["eval_ms"] / base["eval_ms"], 3)
            device, device1 = rec["device_time"], base["device_time"]
            if device["offered"] and device1["offered"] and device1["median_ms"]:
                rec["device_vs_b1"] = round(device["median_ms"] / device1["median_ms"], 3)
    r["result"] = next((x["result"] for x in r["batches"] if x["result"] != "ok"), "ok")
    return r

# K of the prompt-pack check: BatchDecoder's PACK_ROWS (4, 8), and 16, which vane leaves
# out (on the Qwen3-0.6B shape's 8 layers, 16 prompts of 12 tokens took 420 ms in packs
# of 2, 400 ms one verify each) and a device may not
SMOKE_PACK_ROWS = (4, 8, 16)


def prompt_packs(cache: int = 256, evals: int = 20, seed: int = 8, backend: str = "ane"
                 ) -> dict[str, Any]:
    """One GPT-2 small layer as the prompt-pack program (orion.models.batch_programs,
    what `BatchDecoder.pack` runs): 32 columns in G groups of K rows, each group a prompt
    of K tokens from position 0, for each K of `SMOKE_PACK_ROWS`. Timed against what a
    pack replaces, the G prompts' verify programs of K rows (each against an empty
    `cache`-row cache), evaluated in turn; each group's rows checked against vane's
    pack and against its own verify's. What to read: `vs_verifies`, the pack's eval
    against the G verifies' (below 1: short prompts waiting together go in cheaper as
    one pack)."""
    from orion.ir.composites import MASK_VALUE
    from orion.models import programs as P
    from orion.models.architectures import gpt2
    from orion.models.batch import PACK_COLUMNS
    from orion.models.batch_programs import prompts_graph

    arch = gpt2.Model.from_config({"model_type": "gpt2", "n_layer": 1}, "GPT-2 small")
    a = arch.args
    rng = np.random.default_rng(seed)
    weights = _layer_weights(arch, rng)
    x = rng.standard_normal((PACK_COLUMNS, a.dim)).astype(np.float16)
    empty = np.full((cache, 1), MASK_VALUE, np.float16)   # a verify from position 0
    r: dict[str, Any] = {"shape": {"n_embd": a.dim, "n_head": a.n_heads, "cache": cache},
                         "columns": PACK_COLUMNS, "evals": evals, "backend": backend,
                         "packs": []}
    for k in SMOKE_PACK_ROWS:
        groups = PACK_COLUMNS // k
        pack = P.lower(prompts_graph(arch, weights, range(1), f"smoke_pack{k}", k,
                                     PACK_COLUMNS))
        verify = P.lower(P.verify_graph(arch, weights, range(1), f"smoke_verify{k}", cache, k))
        pack_feeds = _fold_feeds(pack, PACK_COLUMNS, {"x": x})
        verify_feeds = [_fold_feeds(verify, k, {"x": x[g * k: (g + 1) * k],
                                                "mask": np.repeat(empty, k, 1)})
                        for g in range(groups)]
        rec: dict[str, Any] = {"rows": k, "prompts": groups}
        with Program.compile(pack.mil, pack.weights, backend="vane") as v:
            v.load()
            want = _batch_outputs(pack, _timed_tokens([(v, pack_feeds)], 1)[0][0],
                                  PACK_COLUMNS, a.dim)
        try:
            p, ms = _ms(lambda em=pack: Program.compile(em.mil, em.weights, backend=backend))
            rec["compile_ms"] = round(ms, 1)
            hw: list[Any] = []
            with p, Program.compile(verify.mil, verify.weights, backend=backend) as q:
                p.load()
                q.load()
                (outs,), pack_ms = _timed_tokens([(p, pack_feeds)], evals, hw)
                alone, verifies_ms = _timed_tokens([(q, f) for f in verify_feeds], evals)
        except OrionError as e:
            rec.update(result="error", error=str(e))
            r["packs"].append(rec)
            continue
        got = _batch_outputs(pack, outs, PACK_COLUMNS, a.dim)
        each = [_batch_outputs(verify, o, k, a.dim) for o in alone]
        by_verify = {name: np.concatenate([e[name] for e in each]) for name in got}
        _judge(rec, {"vane": (got, want), "verify": (got, by_verify)})
        rec["pack_ms"] = round(pack_ms, 4)
        rec["verifies_ms"] = round(verifies_ms, 4)
        rec["vs_verifies"] = round(pack_ms / verifies_ms, 3)
        rec["device_time"] = _device_time(hw)
        r["packs"].append(rec)
    r["result"] = next((x["result"] for x in r["packs"] if x["result"] != "ok"), "ok")
    return r


def _conv_mil(c: int, s: int, key: str) -> str:
    t = f"tensor<fp16, [1, {c}, 1, {s}]>"
    body = (
        '        string pt = const()[name = string("pt"), val = string("valid")];\n'
        '        tensor<int32, [2]> st = const()[name = string("st"), '
        'val = tensor<int32, [2]>([1, 1])];\n'
        '        tensor<int32, [4]> pd = const()[name = string("pd"), '
        'val = tensor<int32, [4]>([0, 0, 0, 0])];\n'
        '        tensor<int32, [2]> dl = const()[name = string("dl"), '
        'val = tensor<int32, [2]>([1, 1])];\n'
        '        int32 gr = const()[name = string("gr"), val = int32(1)];\n'
        f'        tensor<fp16, [{c}, {c}, 1, 1]> w = const()[name = string("w"), '
        f'val = tensor<fp16, [{c}, {c}, 1, 1]>(BLOBFILE(path = string("{key}"), '
        'offset = uint64(64)))];\n'
        f'        {t} out_y = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, '
        'strides = st, weight = w, x = in_x)[name = string("out_y")];\n')
    return _program(body, f"{t} in_x", "out_y")


def _device_time(times: list[Any]) -> dict[str, Any]:
    """The device's own execution time over a run of evals (Program.hw_time() after each)."""
    offered = [t for t in times if t.offered]
    if not offered:
        return {"offered": False, "why": times[-1].why if times else "no evaluation"}
    ns = [t.ns for t in offered]
    return {"offered": True, "evals": len(times), "reported": sum(n > 0 for n in ns),
            "zero": sum(n == 0 for n in ns), "median_ms": round(statistics.median(ns) / 1e6, 4)}


def basics(channels: int = 512, seq: int = 64, evals: int = 20) -> dict[str, Any]:
    """The conv against numpy (no one here wrote numpy's matmul) and vane, the binding
    order, the timings of one program's life, and the device's own time of each eval."""
    rng = np.random.default_rng(4)
    key = "@model_path/weights/w.bin"
    w = (rng.standard_normal((channels, channels)) / np.sqrt(channels)).astype(np.float16)
    x = rng.standard_normal((channels, seq)).astype(np.float16)
    mil = _conv_mil(channels, seq, key)
    files = {key: blob_bytes({"w": w.reshape(channels, channels, 1, 1)})[0]}
    ref = w.astype(np.float32) @ x.astype(np.float32)
    r: dict[str, Any] = {"shape": [1, channels, 1, seq]}
    with Program.compile(mil, files, backend="vane") as v:
        vane_y = v.run({"in_x": x})["out_y"].reshape(channels, seq).astype(np.float32)
    p, r["compile_ms"] = _ms(lambda: Program.compile(mil, files, backend="ane"))
    hw = []
    with p:
        _, r["load_ms"] = _ms(p.load)
        ins, outs = p.surfaces()
        ins[0].write(x)
        times = []
        for _ in range(evals):
            times.append(_ms(lambda: p.eval(ins, outs))[1])
            hw.append(p.hw_time())
        r["eval_ms_median"] = statistics.median(times)
        y = outs[0].read((channels, seq)).astype(np.float32)
        for s in ins + outs:
            s.release()
    r["device_time"] = _device_time(hw)
    r["conv_max_err_vs_numpy"] = float(np.max(np.abs(y - ref)))
    r["conv_max_err_vs_vane"] = float(np.max(np.abs(y - vane_y)))
    t = f"tensor<fp16, [1, {C}, 1, {S}]>"
    two = _program(f'        {t} out_s = add(x = in_a, y = in_b)[name = string("out_s")];\n'
                   f'        {t} out_d = sub(x = in_a, y = in_b)[name = string("out_d")];\n',
                   f"{t} in_b, {t} in_a", "out_s, out_d")
    a = rng.standard_normal((C, S)).astype(np.float16)
    b = rng.standard_normal((C, S)).astype(np.float16)
    with Program.compile(two, backend="ane") as p2:
        out = p2.run({"in_a": a, "in_b": b})
    r["binding_order_sorted"] = bool(
        _close({"s": out["out_s"].reshape(C, S)}, {"s": a + b})
        and _close({"d": out["out_d"].reshape(C, S)}, {"d": a - b}))
    ok = r["conv_max_err_vs_numpy"] < 0.05 and r["binding_order_sorted"]
    r["result"] = "ok" if ok else "wrong"
    for k in ("compile_ms", "load_ms", "eval_ms_median"):
        r[k] = round(r[k], 3)
    return r


def _compressed_weights(rng: np.random.Generator, o: int, i: int) -> dict[str, Any]:
    """The weight of one conv in each format, as orion.models.quantized makes them."""
    from orion.ir.quant import QuantTensor, pack_codes

    def grid(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.random((rows, cols)) * scale + scale / 4).astype(np.float16)

    return {
        "fp16": (rng.standard_normal((o, i)) * 0.03).astype(np.float16),
        "mlx_4bit_g64": QuantTensor("shift_scale", (o, i), pack_codes(
            rng.integers(0, 16, (o, i)), 4), "uint4", grid(o, i // 64, 0.01),
            (rng.random((o, i // 64)) * 15).astype(np.float16)),
        "q4_0_g32": QuantTensor("shift_scale", (o, i), pack_codes(
            rng.integers(-8, 8, (o, i)), 4), "int4", grid(o, i // 32, 0.01)),
        "q8_0_g32": QuantTensor("shift_scale", (o, i), pack_codes(
            rng.integers(-128, 128, (o, i)), 8), "int8", grid(o, i // 32, 3e-4)),
        "int8_per_channel": QuantTensor("shift_scale", (o, i), pack_codes(
            rng.integers(-128, 128, (o, i)), 8), "int8", grid(o, 1, 3e-4)),
        "affine_int8": QuantTensor("affine", (o, i), pack_codes(
            rng.integers(-128, 128, (o, i)), 8), "int8", grid(o, 1, 3e-4)[:, 0],
            np.zeros(o, np.int8)),
        "lut4_per_16_channels": QuantTensor("lut", (o, i), pack_codes(
            rng.integers(0, 16, (o, i)), 4), "uint4",
            lut=(rng.standard_normal((o // 16, 1, 16, 1)) * 0.03).astype(np.float16)),
        # what `orion convert --palettize` writes: the scale multiplies the conv's output
        "lut4_per_16_channels_scaled": QuantTensor("lut", (o, i), pack_codes(
            rng.integers(0, 16, (o, i)), 4), "uint4",
            lut=(rng.standard_normal((o // 16, 1, 16, 1)) * 0.5).astype(np.float16),
            post_scale=grid(o, 1, 0.05)[:, 0]),
        "lut2_g64": QuantTensor("lut", (o, i), pack_codes(rng.integers(0, 4, (o, i)), 2),
                                "uint2",
                                lut=(rng.standard_normal((o, i // 64, 4, 1)) * 0.03
                                     ).astype(np.float16)),
    }


def compressed(width: int = 768, seq: int = 64, evals: int = 20, seed: int = 6,
               backend: str = "ane") -> dict[str, Any]:
    """Each format's conv against vane, timed against fp16 (see the module docstring)."""
    from orion.ir import Graph
    from orion.ir.compile import lower_graph
    from orion.ir.quant import QuantTensor

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((width, seq)).astype(np.float16)
    out: dict[str, Any] = {}
    for name, w in _compressed_weights(rng, width, width).items():
        g = Graph(f"smoke_{name}")
        xin = g.input("in_x", (1, width, 1, seq))
        post = w.post_scale if isinstance(w, QuantTensor) else None
        wv = w.unscaled().with_shape((width, width, 1, 1)) if isinstance(w, QuantTensor) \
            else w.reshape(width, width, 1, 1)
        y = g.conv1x1(xin, g.const(wv, name="w"))
        if post is not None:
            y = g.mul(y, g.const(post.reshape(1, width, 1, 1), name="w_scale"))
        g.output("out_y", y)
        em = lower_graph(g).emitted[0]
        feeds = {em.inputs[0].name: x.reshape(1, width, 1, seq)}
        rec: dict[str, Any] = {}
        with Program.compile(em.mil, em.weights, backend="vane") as v:
            want = v.run(feeds)
        try:
            p, rec["compile_ms"] = _ms(lambda em=em: Program.compile(em.mil, em.weights,
                                                                     backend=backend))
            with p:
                got = p.run(feeds)
                times = [_ms(lambda p=p, f=feeds: p.run(f))[1] for _ in range(evals)]
            rec["eval_ms_median"] = round(statistics.median(times), 4)
            rec["result"] = "ok" if _close(got, want) else "wrong"
        except OrionError as e:
            rec.update(result="error", error=str(e))
        rec["weight_bytes"] = int(w.nbytes)
        out[name] = rec
    base = out["fp16"].get("eval_ms_median")
    for rec in out.values():
        if base and "eval_ms_median" in rec:
            rec["vs_fp16"] = round(rec["eval_ms_median"] / base, 3)
    return out


# ---- the report -----------------------------------------------------------------------


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def framework_path() -> str:
    return os.environ.get("ORION_ANE_FRAMEWORK") or SYSTEM_FRAMEWORK


def system_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "orion": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
        "machine": platform.machine(), "ane": describe_backend("ane"),
        "framework": framework_path(), "standin": framework_path() != SYSTEM_FRAMEWORK,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("ORION_", "ANE_STANDIN_"))},
    }
    if sys.platform == "darwin":
        info["sw_vers"] = _run(["sw_vers"])
        info["chip"] = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        for plist in ("Versions/A/Resources/version.plist", "Versions/A/Resources/Info.plist",
                      "Resources/version.plist", "Resources/Info.plist"):
            try:
                data = plistlib.loads((FRAMEWORK / plist).read_bytes())
            except (OSError, plistlib.InvalidFileException):
                continue
            info["ane_framework"] = {k: data.get(k) for k in (
                "CFBundleShortVersionString", "CFBundleVersion", "SourceVersion",
                "ProjectName") if k in data}
            break
    return info


def _updated(report: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [*report["variants"].items(), ("multi_entry", report["multi_entry"]),
            *([("gpt2_layer", report["gpt2_layer"])] if "gpt2_layer" in report else [])]


def failures(report: Mapping[str, Any]) -> list[str]:
    out = []
    for name in BACKEND_PATHS:
        if report["variants"][name]["result"] != "ok":
            out.append(f"variant {name}: {report['variants'][name]['result']}")
    for name in ("basics", "multi_entry", "inputs", "gpt2_layer", "layer_programs",
                 "batched_decode", "prompt_packs"):
        if name in report and report[name]["result"] != "ok":
            out.append(f"{name}: {report[name]['result']}")
    layout = report.get("layouts", {})
    if layout and layout["one_file"]["result"] != "ok":
        out.append(f"layouts: one weight file: {layout['one_file']['result']}")
    if layout and layout["two_files"]["result"] == "wrong":
        out.append("layouts: two weight files: wrong numbers (a refusal would be allowed)")
    device = report["basics"].get("device_time", {})
    if device.get("offered") and device["zero"]:
        out.append(f"basics: device time: the framework offers _ANEPerformanceStats but "
                   f"{device['zero']} of {device['evals']} evals report 0 ns")
    for name, rec in _updated(report):
        if rec.get("missed_compile"):
            out.append(f"{name}: a compile the backend missed (a load took compile time, "
                       "uncounted)")
        if not rec.get("agrees_at_compile", True):
            out.append(f"{name}: disagrees with vane right after compile")
    return out


def _case_line(label: str, rec: Mapping[str, Any], timed: str,
               figures: Callable[[], str]) -> str:
    """One case's indented line: its result and `figures()` where it ran (`timed` in
    rec), else its result and error."""
    if timed not in rec:
        return f"    {label}: {rec['result']} {rec.get('error', '')[:100]}"
    return f"    {label}: {rec['result']:<5} {figures()}"


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The printed report, one line per check (docs/ane-backend.md explains each)."""
    system = report["system"]
    where = (f"stand-in {system['framework']}" if system["standin"]
             else f"macOS {platform.mac_ver()[0]}, {system.get('chip') or platform.machine()}")
    b = report["basics"]
    lines = [f"ane smoke on {where}",
             f"basics: {b['result']}: conv {b['shape'][1]}x{b['shape'][3]} max error "
             f"{b['conv_max_err_vs_numpy']:.4f} vs numpy, {b['conv_max_err_vs_vane']:.4f} vs "
             f"vane; binding order {'sorted' if b['binding_order_sorted'] else 'WRONG'}; "
             f"compile {b['compile_ms']:.1f} ms, load {b['load_ms']:.1f} ms, eval "
             f"{b['eval_ms_median']:.3f} ms"]
    d = b["device_time"]
    lines.append(f"device time: {d['reported']} of {d['evals']} evals report it, median "
                 f"{d['median_ms']} ms" if d["offered"]
                 else f"device time: not offered ({d['why']})")
    lay = report["layouts"]
    lines.append("layouts: " + "; ".join(
        f"{k.replace('_', ' ')} {v['result']}" + (f" ({v['error'][:120]})" if "error" in v else "")
        for k, v in lay.items()))
    for name, rec in report["variants"].items():
        steps = ", ".join(f"error: {u['error'][:80]}" if "error" in u else
                          f"{u['update_ms']:.1f} ms / {u['compiles_counted']} counted"
                          for u in rec["updates"])
        label = " (compiles by design)" if rec.get("expect") == "compile" else ""
        compiled = sum(u.get("load_compiled", 0) for u in rec["updates"])
        loads = f"; {compiled} load(s) took a compile's time, counted" if compiled else ""
        lines.append(f"{name:>10}: {rec['result']:<9} {steps}{label}{loads}")
        if name == "auto" and rec["updates"]:
            lines.append(f"            its path: {rec['updates'][-1]['update_path']}")
    lines.append(f"multi_entry: {report['multi_entry']['result']}; inputs: "
                 f"{report['inputs']['result']} ({report['inputs']['compiles_counted']} "
                 "compiles)" + (f"; gpt2_layer: {report['gpt2_layer']['result']}"
                                if "gpt2_layer" in report else ""))
    if "layer_programs" in report:
        lp = report["layer_programs"]
        lines.append(f"layer programs: {lp['result']}; {lp['layers']} GPT-2 decode layers: one "
                     f"program {lp['eval_ms']['layers_program']:.3f} ms, {lp['layers']} "
                     f"programs {lp['eval_ms']['one_layer_programs']:.3f} ms: "
                     f"{lp['dispatch_ms_per_program']:.3f} ms a program's dispatch, "
                     f"{lp['ms_per_layer']:.3f} ms a layer")
    if "batched_decode" in report:
        bd = report["batched_decode"]
        lines.append(f"batched decode: {bd['result']}; a GPT-2 decode layer "
                     f"({bd['shape']['n_embd']} wide, {bd['shape']['cache']}-row caches), "
                     "per eval of B rows:")
        for rec in bd["batches"]:
            device = rec.get("device_time", {})
            on_device = (f"; device {device['median_ms']:.3f} ms "
                         f"({rec.get('device_vs_b1', '?')}x)" if device.get("offered") else "")
            lines.append(_case_line(
                f"B {rec['rows']:>2}", rec, "eval_ms",
                lambda r=rec, d=on_device: f"{r['eval_ms']:.3f} ms ({r.get('vs_b1', '?')}x "
                f"B 1), {r['ms_per_column']:.3f} ms a column{d}"))
    if "prompt_packs" in report:
        pp = report["prompt_packs"]
        lines.append(f"prompt packs: {pp['result']}; a GPT-2 layer, {pp['columns']} rows as G "
                     "prompts of K, one eval against G verifies:")
        for rec in pp["packs"]:
            device = rec.get("device_time", {})
            on_device = (f"; device {device['median_ms']:.3f} ms a pack"
                         if device.get("offered") else "")
            lines.append(_case_line(
                f"K {rec['rows']:>2}, G {rec['prompts']}", rec, "pack_ms",
                lambda r=rec, d=on_device: f"pack {r['pack_ms']:.3f} ms, verifies "
                f"{r['verifies_ms']:.3f} ms ({r['vs_verifies']}x){d}"))
    lines.append(f"full compile: {report['variants']['auto']['compile_ms']:.1f} ms")
    for name, rec in report.get("compressed", {}).items():
        detail = (f"eval {rec['eval_ms_median']:.3f} ms ({rec.get('vs_fp16', '?')}x fp16)"
                  if "eval_ms_median" in rec else rec.get("error", "")[:100])
        lines.append(f"compressed {name:>27}: {rec['result']:<6} {detail}, "
                     f"{rec['weight_bytes']} weight bytes")
    return lines


def _batch_rows(text: str) -> tuple[int, ...]:
    """`--batch-rows`: B values in [1, 32] (a surface row's columns), or 0."""
    try:
        rows = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}") from None
    if rows == (0,):
        return ()
    if not rows or not all(1 <= b <= 32 for b in rows):
        raise argparse.ArgumentTypeError(f"each B must be in [1, 32] (or 0 alone), got {text!r}")
    return rows


def _batch_cache(text: str) -> int:
    """`--batch-cache`: a decode bucket, a positive multiple of 32."""
    try:
        cache = int(text)
    except ValueError:
        cache = 0
    if cache < 32 or cache % 32:
        raise argparse.ArgumentTypeError(f"a positive multiple of 32, got {text!r}")
    return cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", "--json", default="ane_smoke.json",
                        help="the JSON report to write")
    parser.add_argument("--skip-gpt2", action="store_true", help="leave out the GPT-2 layer")
    parser.add_argument("--skip-compressed", action="store_true",
                        help="leave out the compressed-weight formats")
    parser.add_argument("--layers", type=int, default=4,
                        help="GPT-2 decode layers of the layer-programs check (0: leave it "
                             "out)")
    parser.add_argument("--batch-rows", type=_batch_rows, default=BATCH_ROWS,
                        help="the B of the batched-decode check, comma-separated (0: leave it "
                             "out)")
    parser.add_argument("--batch-cache", type=_batch_cache, default=256,
                        help="the cache rows of each sequence in the batched-decode check")
    parser.add_argument("--skip-packs", action="store_true",
                        help="leave out the prompt-pack check")
    parser.add_argument("--standin", action="store_true",
                        help="judge a stand-in framework (ORION_ANE_FRAMEWORK) as if it were "
                             "the device: for Orion's own tests")
    args = parser.parse_args(argv)
    if "ane" not in backends():
        print(f"the ane backend is not available: {describe_backend('ane')}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    os.environ["ORION_ANE_PERF_STATS"] = "1"   # read at compile: every program here asks
    report: dict[str, Any] = {"system": system_info(), "basics": basics()}
    report["layouts"] = layouts()
    report["variants"] = variants()
    report["multi_entry"] = multi_entry()
    report["inputs"] = inputs_strategy()
    if not args.skip_gpt2:
        report["gpt2_layer"] = gpt2_layer()
    if not args.skip_compressed:
        report["compressed"] = compressed()
    if args.layers > 1:
        report["layer_programs"] = layer_programs(args.layers)
    if args.batch_rows:
        report["batched_decode"] = batched_decode(args.batch_rows, args.batch_cache)
    if not args.skip_packs:
        report["prompt_packs"] = prompt_packs()
    report["update_stats"] = dataclasses.asdict(update_stats())
    report["failures"] = failures(report)
    standin = report["system"]["standin"]
    report["judged"] = not standin or args.standin
    report["passed"] = report["judged"] and not report["failures"]
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for line in summary_lines(report):
        print(line)
    print(f"report: {args.out}")
    for line in report["failures"]:
        print(f"FAIL {line}")
    if not report["judged"]:
        print(f"NOT JUDGED: {framework_path()} is not the system framework (a stand-in): its "
              "numbers say nothing about a device; --standin judges it anyway")
        return EXIT_STANDIN
    print("PASSED" if report["passed"] else "FAILED")
    return EXIT_PASSED if report["passed"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
