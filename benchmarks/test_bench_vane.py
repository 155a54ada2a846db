"""vane programs against the floor and the peer a user would compare with.

(a) Decode GEMV as a vane program (slice one column of a width-32 input, 1x1
    conv, pad back), in GB/s of fp16 weight bytes read, against a numpy copy of
    the same number of bytes (memory bandwidth) at 2 threads. Target >= 0.70.
(c) fp16 GEMM 256x768x3072 as a conv program, against numpy's fp32 matmul of
    the same shape (BLAS), in GFLOP/s.
Figures come from a median of repeated calls in this process, printed at the end.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from orion.runtime import (
    Program,
    Surface,
    compile_budget,
    num_threads,
    set_compile_budget,
    set_num_threads,
)
from orion.runtime.blob import blob_bytes

KEY = "@model_path/weights/w.bin"
HEADER = """program(1.3)
[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, \
{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, \
{"coremltools-version", "9.0"}})]
"""
CONV_CONSTS = [
    'string pt = const()[name = string("pt"), val = string("valid")];',
    'tensor<int32, [2]> st = const()[name = string("st"), val = tensor<int32, [2]>([1, 1])];',
    'tensor<int32, [4]> pd = const()[name = string("pd"), val = tensor<int32, [4]>([0, 0, 0, 0])];',
    'tensor<int32, [2]> dl = const()[name = string("dl"), val = tensor<int32, [2]>([1, 1])];',
    'int32 gr = const()[name = string("gr"), val = int32(1)];',
]
CONV = "conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st"


def program(body: list[str], c: int, s: int, out: str) -> str:
    lines = "\n        ".join(CONV_CONSTS + body)
    return (HEADER + f"{{\n    func main<ios18>(tensor<fp16, [1, {c}, 1, {s}]> in_x) {{\n"
            f"        {lines}\n    }} -> ({out});\n}}\n")


def gemv_mil(c: int, o: int, offset: int) -> str:
    """Decode: column 0 of [1, c, 1, 32] -> conv -> [1, o, 1, 1] -> pad to width 32."""
    w = f"tensor<fp16, [{o}, {c}, 1, 1]>"
    return program([
        f'{w} w = const()[name = string("w"), val = {w}(BLOBFILE(path = string("{KEY}"), '
        f"offset = uint64({offset})))];",
        'tensor<int32, [4]> b0 = const()[name = string("b0"), '
        'val = tensor<int32, [4]>([0, 0, 0, 0])];',
        f'tensor<int32, [4]> e0 = const()[name = string("e0"), '
        f"val = tensor<int32, [4]>([1, {c}, 1, 1])];",
        f'tensor<fp16, [1, {c}, 1, 1]> col = slice_by_index(begin = b0, end = e0, x = in_x)'
        '[name = string("col")];',
        f'tensor<fp16, [1, {o}, 1, 1]> y1 = {CONV}, weight = w, x = col)[name = string("y1")];',
        'tensor<int32, [6]> pp = const()[name = string("pp"), '
        "val = tensor<int32, [6]>([0, 0, 0, 0, 0, 31])];",
        'string pm = const()[name = string("pm"), val = string("constant")];',
        'fp16 pv = const()[name = string("pv"), val = fp16(0)];',
        f'tensor<fp16, [1, {o}, 1, 32]> out_y = pad(constant_val = pv, mode = pm, pad = pp, '
        'x = y1)[name = string("out_y")];',
    ], c, 32, "out_y")


def gemm_mil(c: int, o: int, s: int, offset: int) -> str:
    w = f"tensor<fp16, [{o}, {c}, 1, 1]>"
    return program([
        f'{w} w = const()[name = string("w"), val = {w}(BLOBFILE(path = string("{KEY}"), '
        f"offset = uint64({offset})))];",
        f'tensor<fp16, [1, {o}, 1, {s}]> out_y = {CONV}, weight = w, x = in_x)'
        '[name = string("out_y")];',
    ], c, s, "out_y")


def median_time(fn, reps: int = 15) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    old_threads, old_budget = num_threads(), compile_budget()
    set_num_threads(2)
    set_compile_budget(old_budget + 100)
    yield
    set_num_threads(old_threads)
    set_compile_budget(old_budget)


def loaded(mil: str, blob: bytes, c: int, s: int, o: int, so: int):
    p = Program.compile(mil, {KEY: blob}, backend="vane")
    p.load()
    x = Surface.tensor(c, s)
    y = Surface.tensor(o, so)
    x.write(np.random.default_rng(0).standard_normal((c, s)).astype(np.float16))
    return p, x, y


@pytest.mark.parametrize("c,o", [(768, 3072), (3072, 768), (768, 50257)])
def test_gemv_weight_bandwidth(benchmark, figures, c, o):
    w = (np.random.default_rng(1).standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float16)
    blob, offs = blob_bytes([("w", w)])
    p, x, y = loaded(gemv_mil(c, o, offs["w"]), blob, c, 32, o, 32)
    try:
        run = lambda: p.eval([x], [y])  # noqa: E731
        benchmark(run)
        t_vane = median_time(run)
        src, dst = w.reshape(-1).copy(), np.empty(w.size, np.float16)
        t_copy = median_time(lambda: np.copyto(dst, src))
        gbs, copy_gbs = w.nbytes / t_vane / 1e9, w.nbytes / t_copy / 1e9
        figures.add(f"vane GEMV {c}x{o} weights", gbs, "GB/s")
        figures.add(f"numpy copy of {w.nbytes / 1e6:.1f} MB", copy_gbs, "GB/s")
        figures.ratio(f"vane GEMV {c}x{o} / memcpy (target 0.70)", gbs, copy_gbs)
        want = (w.reshape(o, c).astype(np.float32) @ x.read((c, 32))[:, 0].astype(np.float32))
        got = y.read((o, 32))[:, 0].astype(np.float32)
        assert np.allclose(got, want, rtol=1e-2, atol=1e-2)
    finally:
        x.release()
        y.release()
        p.release()


def test_gemm_256x768x3072(benchmark, figures):
    m, k, n = 256, 768, 3072   # tokens x in x out
    w = (np.random.default_rng(2).standard_normal((n, k, 1, 1)) / np.sqrt(k)).astype(np.float16)
    blob, offs = blob_bytes([("w", w)])
    p, x, y = loaded(gemm_mil(k, n, m, offs["w"]), blob, k, m, n, m)
    try:
        run = lambda: p.eval([x], [y])  # noqa: E731
        benchmark(run)
        t_vane = median_time(run, reps=7)
        a32 = w.reshape(n, k).astype(np.float32)
        b32 = np.random.default_rng(3).standard_normal((k, m)).astype(np.float32)
        t_np = median_time(lambda: a32 @ b32, reps=7)
        flops = 2.0 * m * k * n
        figures.add("vane fp16 GEMM 256x768x3072", flops / t_vane / 1e9, "GFLOP/s")
        figures.add("numpy fp32 matmul 256x768x3072", flops / t_np / 1e9, "GFLOP/s")
        figures.ratio("vane GEMM / numpy fp32 matmul", flops / t_vane, flops / t_np)
    finally:
        x.release()
        y.release()
        p.release()
