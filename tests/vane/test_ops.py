"""Every op vane executes, on hypothesis-generated shapes, against numpy
references with the device's rounding (fp16 inputs, fp32 compute, fp16 result)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orion.runtime.blob import blob_bytes
from vane.milgen import Mil
from vane.refs import F32, assert_dot_close, assert_f16_equal_ulps, f16, run, up

pytestmark = pytest.mark.native

PROPS = settings(max_examples=40, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)
seeds = st.integers(0, 2**32 - 1)


def rng_of(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@st.composite
def broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """An output shape and two operand shapes that broadcast to it (numpy rules)."""
    out = draw(shapes)

    def operand() -> tuple[int, ...]:
        drop = draw(st.integers(0, len(out) - 1))
        return tuple(1 if draw(st.booleans()) else d for d in out[drop:])

    a, b = operand(), operand()
    full = np.broadcast_shapes(a, b)
    return full, a, b


# ---- elementwise -----------------------------------------------------------

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "real_div": lambda a, b: a / b,
    "pow": lambda a, b: np.power(a, b),
    "maximum": np.maximum,
    "minimum": np.minimum,
}


def binary_operands(op: str, rng: np.random.Generator, sa: tuple, sb: tuple):
    x = rng.standard_normal(sa) * 4
    y = rng.standard_normal(sb) * 4
    if op == "real_div":
        y = np.sign(y + 1e-3) * (0.25 + np.abs(y))
    if op == "pow":
        x = 0.25 + np.abs(x)
        y = np.clip(y / 2, -2, 2)
    return f16(x), f16(y)


@pytest.mark.parametrize("op", sorted(BINARY))
@PROPS
@given(shp=broadcast_pair(), seed=seeds)
def test_binary_broadcasts_like_numpy(op, shp, seed):
    out, sa, sb = shp
    x, y = binary_operands(op, rng_of(seed), sa, sb)
    m = Mil()
    a, b = m.wrap_input("xa", sa), m.wrap_input("xb", sb)
    r = m.op(op, out, x=a, y=b)
    o = m.wrap_output(r, "ya")
    got = run(m.text([o]), {"xa": x, "xb": y}, {"ya": out})["ya"]
    want = f16(BINARY[op](up(x), up(y)))
    assert_f16_equal_ulps(got, want, ulps=0 if op != "pow" else 1)


@pytest.mark.parametrize("op", ["mul", "add", "maximum"])
@pytest.mark.parametrize("out,sa,sb", [
    ((1, 128, 16, 1), (1, 128, 16, 1), (1, 1, 16, 1)),   # a Qwen3 head norm's row product
    ((1, 128, 16, 1), (1, 1, 16, 1), (1, 128, 1, 1)),    # a row times a column
    ((3, 40, 7, 5), (3, 1, 7, 5), (40, 1, 1)),           # rows past one pass (CHUNK)
    ((2, 100, 3), (2, 100, 3), (2, 1, 3)),
])
def test_binary_broadcast_over_many_short_rows(op, out, sa, sb):
    """Short rows are computed many to a pass (ew_short_rows): the same bits as numpy
    over rows that follow in memory, repeat (broadcast) or neither."""
    x, y = binary_operands(op, rng_of(7), sa, sb)
    m = Mil()
    r = m.op(op, out, x=m.wrap_input("xa", sa), y=m.wrap_input("xb", sb))
    got = run(m.text([m.wrap_output(r, "ya")]), {"xa": x, "xb": y}, {"ya": out})["ya"]
    assert_f16_equal_ulps(got, f16(BINARY[op](up(x), up(y))), ulps=0)


@pytest.mark.parametrize("op", ["add", "mul", "sub", "pow"])
@PROPS
@given(shape=shapes, seed=seeds, c=st.floats(0.25, 3.0), const_first=st.booleans())
def test_binary_with_scalar_const(op, shape, seed, c, const_first):
    x, _ = binary_operands(op, rng_of(seed), shape, ())
    c = float(f16(c))
    if op == "pow":
        const_first = False
    m = Mil()
    a = m.wrap_input("xa", shape)
    k = m.const(c, "fp16")
    args = {"x": k, "y": a} if const_first else {"x": a, "y": k}
    o = m.wrap_output(m.op(op, shape, **args), "ya")
    got = run(m.text([o]), {"xa": x}, {"ya": shape})["ya"]
    cx = np.float32(c)
    want = f16(BINARY[op](cx, up(x)) if const_first else BINARY[op](up(x), cx))
    assert_f16_equal_ulps(got, want, ulps=0 if op != "pow" else 1)


UNARY = {
    "sigmoid": (lambda x: F32(1) / (F32(1) + np.exp(-x)), 4.0),
    "tanh": (np.tanh, 3.0),
    "exp": (np.exp, 3.0),
    "sqrt": (lambda x: np.sqrt(np.abs(x)), 10.0),
    "relu": (lambda x: np.maximum(x, F32(0)), 5.0),
    "neg": (lambda x: -x, 5.0),
    "identity": (lambda x: x, 5.0),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@PROPS
@given(shape=shapes, seed=seeds)
def test_unary(op, shape, seed):
    fn, scale = UNARY[op]
    x = f16(rng_of(seed).standard_normal(shape) * scale)
    if op == "sqrt":
        x = np.abs(x)
    m = Mil()
    a = m.wrap_input("xa", shape)
    r = m.op(op, shape, x=a)
    # identity as the sole output is unreliable on the device; consume it
    o = m.wrap_output(r, "ya")
    got = run(m.text([o]), {"xa": x}, {"ya": shape})["ya"]
    assert_f16_equal_ulps(got, f16(fn(up(x))), ulps=1)


@PROPS
@given(shape=shapes, seed=seeds, lo=st.floats(-4, 0), width=st.floats(0, 4))
def test_clip(shape, seed, lo, width):
    x = f16(rng_of(seed).standard_normal(shape) * 4)
    lo, hi = float(f16(lo)), float(f16(lo + width))
    m = Mil()
    a = m.wrap_input("xa", shape)
    r = m.op("clip", shape, x=a, alpha=m.const(lo, "fp16"), beta=m.const(hi, "fp16"))
    got = run(m.text([m.wrap_output(r, "ya")]), {"xa": x}, {"ya": shape})["ya"]
    assert_f16_equal_ulps(got, f16(np.clip(up(x), lo, hi)), ulps=0)


def test_fp32_interior_is_not_rounded_to_fp16():
    """cast to fp32, two fp32 multiplies, cast back: one fp16 rounding at the end."""
    shape = (4, 96)
    x = f16(np.linspace(-3, 3, 384).reshape(shape))
    third = float(np.float32(1 / 3))
    m = Mil()
    a = m.wrap_input("xa", shape)
    c = m.op("cast", shape, "fp32", x=a, dtype=m.const("fp32", "string"))
    d = m.op("mul", shape, "fp32", x=c, y=m.const(third, "fp32"))
    e = m.op("mul", shape, "fp32", x=d, y=m.const(3.0, "fp32"))
    h = m.op("cast", shape, x=e, dtype=m.const("fp16", "string"))
    got = run(m.text([m.wrap_output(h, "ya")]), {"xa": x}, {"ya": shape})["ya"]
    want = f16(up(x) * np.float32(third) * np.float32(3))
    assert_f16_equal_ulps(got, want, ulps=0)
    # the same arithmetic in fp16 rounds in between and differs somewhere
    fp16_path = f16(up(f16(up(x) * np.float32(third))) * np.float32(3))
    assert not np.array_equal(fp16_path, want)


def test_fp16_overflow_is_inf():
    shape = (8, 32)
    x = f16(np.full(shape, 40000.0))
    x[0, 0] = -40000
    x[1, 1] = 1
    m = Mil()
    a = m.wrap_input("xa", shape)
    r = m.op("add", shape, x=a, y=a)
    got = run(m.text([m.wrap_output(r, "ya")]), {"xa": x}, {"ya": shape})["ya"]
    assert got[0, 0] == -np.inf and got[1, 1] == 2 and np.isposinf(got[2, 2])


# ---- conv and matmul ----------------------------------------------------------

WKEY = "@model_path/weights/w.bin"


@PROPS
@given(c=st.integers(1, 48), o=st.integers(1, 48), s=st.integers(1, 40), seed=seeds)
def test_conv_1x1(c, o, s, seed):
    rng = rng_of(seed)
    x = f16(rng.standard_normal((1, c, 1, s)))
    w = f16(rng.standard_normal((o, c, 1, 1)) / np.sqrt(c))
    blob, offs = blob_bytes([("w", w)])
    m = Mil()
    a = m.wrap_input("xa", (1, c, 1, s))
    wt = m.blob((o, c, 1, 1), WKEY, offs["w"])
    r = m.conv(a, wt, (1, o, 1, s))
    got = run(m.text([m.wrap_output(r, "ya")]), {"xa": x}, {"ya": (1, o, 1, s)},
              weights={WKEY: blob})["ya"]
    w2, x2 = up(w).reshape(o, c).astype(np.float64), up(x).reshape(c, s).astype(np.float64)
    want = f16(w2 @ x2).reshape(1, o, 1, s)
    assert_dot_close(got, want, (np.abs(w2) @ np.abs(x2)).reshape(1, o, 1, s))


@pytest.mark.parametrize("numerics", ["fp16", "strict"])
@pytest.mark.parametrize("c", [512, 600])
def test_conv_columns_keep_their_bits_alone(numerics, c):
    """A 1x1 conv over a few columns (batched decode: one token of each sequence)
    gives every column the bits of the same conv over that column alone: a token's
    logits do not depend on the batch it runs in. C a multiple of 16 and not, O not a
    multiple of 4, up to VK_GEMV_MULTI_MAX (32) columns."""
    o = 67
    rng = np.random.default_rng(c)
    # a wide exponent range: fp32 sums that depend on their order, products that
    # strict numerics flush
    w = f16(rng.standard_normal((o, c, 1, 1)) * 2.0 ** rng.integers(-14, 6, (o, c, 1, 1)))
    blob, offs = blob_bytes([("w", w)])
    weights = {WKEY: blob}
    x = f16(rng.standard_normal((1, c, 1, 32)))
    alone = np.stack([
        run(_conv_program(c, o, 1, offs["w"]), {"xa": x[..., j : j + 1]},
            {"ya": (1, o, 1, 1)}, numerics, weights)["ya"][0, :, 0, 0]
        for j in range(32)
    ], axis=-1)
    for s in (2, 3, 5, 8, 17, 32):
        got = run(_conv_program(c, o, s, offs["w"]), {"xa": np.ascontiguousarray(x[..., :s])},
                  {"ya": (1, o, 1, s)}, numerics, weights)["ya"][0, :, 0, :]
        assert got.view(np.uint16).tolist() == alone[:, :s].view(np.uint16).tolist(), s


@st.composite
def matmul_case(draw: st.DrawFn):
    b1, b2 = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    m, k, n = (draw(st.integers(1, 24)) for _ in range(3))
    xb = draw(st.sampled_from([(b1, b2), (1, b2), (b2,), (b1, 1)]))
    yb = draw(st.sampled_from([(b1, b2), (1, b2), (b2,), ()]))
    if not yb and not xb:
        yb = (b2,)
    tx, ty = draw(st.booleans()), draw(st.booleans())
    return xb, yb, m, k, n, tx, ty


@PROPS
@given(case=matmul_case(), seed=seeds)
def test_matmul_batched_broadcast_transposed(case, seed):
    xb, yb, mm, k, n, tx, ty = case
    rng = rng_of(seed)
    xs = xb + ((k, mm) if tx else (mm, k))
    ys = yb + ((n, k) if ty else (k, n))
    x, y = f16(rng.standard_normal(xs)), f16(rng.standard_normal(ys))
    xe = np.swapaxes(up(x), -1, -2) if tx else up(x)
    ye = np.swapaxes(up(y), -1, -2) if ty else up(y)
    ref = np.matmul(xe.astype(np.float64), ye.astype(np.float64))
    scale = np.matmul(np.abs(xe).astype(np.float64), np.abs(ye).astype(np.float64))
    out = ref.shape
    m = Mil()
    a, b = m.wrap_input("xa", xs), m.wrap_input("xb", ys)
    r = m.op("matmul", out, x=a, y=b, transpose_x=m.const(tx, "bool"),
             transpose_y=m.const(ty, "bool"))
    got = run(m.text([m.wrap_output(r, "ya")]), {"xa": x, "xb": y}, {"ya": out})["ya"]
    assert_dot_close(got, f16(ref), scale)


# ---- reductions and softmax ----------------------------------------------------

REDUCE = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max}


@pytest.mark.parametrize("op", sorted(REDUCE))
@PROPS
@given(shape=shapes, data=st.data(), keep=st.booleans(), seed=seeds)
def test_reductions(op, shape, data, keep, seed):
    r = len(shape)
    axes = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
    neg = data.draw(st.booleans())
    written = [a - r if neg else a for a in axes]
    x = f16(rng_of(seed).standard_normal(shape) * 3)
    ref = REDUCE[op](up(x).astype(np.float64), axis=tuple(axes), keepdims=keep)
    out = ref.shape
    m = Mil()
    a = m.wrap_input("xa", shape)
    red = m.op(op, out, x=a, axes=m.const(written, "int32"),
               keep_dims=m.const(keep, "bool"))
    if not out:   # a scalar result: give it a shape for the output
        red = m.op("reshape", (1,), x=red, shape=m.const([1], "int32"))
        out = (1,)
    got = run(m.text([m.wrap_output(red, "ya")]), {"xa": x}, {"ya": out})["ya"]
    count = int(np.prod([shape[i] for i in axes]))
    assert_dot_close(got, f16(ref).reshape(out),
                     np.full(out, 3.0 * 6 * count / (count if op == "reduce_mean" else 1)))


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max"])
@pytest.mark.parametrize("shape,axis", [((1, 128, 16, 1), 1),   # a Qwen3 head norm's
                                        ((3, 700, 5), 1),        # rows past one load
                                        ((2, 40, 300), 1)])
def test_reduction_over_short_rows_adds_rows_in_order(op, shape, axis):
    """Rows shorter than the load buffer convert many to a call; each output still
    adds its rows in order in fp32, as numpy does along a non-contiguous axis."""
    x = f16(rng_of(3).standard_normal(shape) * 3)
    fn = np.add.reduce if op == "reduce_sum" else np.maximum.reduce
    want = f16(fn(up(x), axis=axis, keepdims=True))
    m = Mil()
    red = m.op(op, want.shape, x=m.wrap_input("xa", shape), axes=m.const([axis], "int32"),
               keep_dims=m.const(True, "bool"))
    got = run(m.text([m.wrap_output(red, "ya")]), {"xa": x}, {"ya": want.shape})["ya"]
    assert_f16_equal_ulps(got, want, ulps=0)


def softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    v = up(x)
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return f16(e / e.sum(axis=axis, keepdims=True))


@PROPS
@given(shape=shapes, data=st.data(), seed=seeds)
def test_softmax(shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = f16(rng_of(seed).standard_normal(shape) * 4)
    m = Mil()
    a = m.wrap_input("xa", shape)
    r = m.op("softmax", shape, x=a, axis=m.const(axis, "int32"))
    got = run(m.text([m.wrap_output(r, "ya")]), {"xa": x}, {"ya": shape})["ya"]
    assert_f16_equal_ulps(got, softmax_ref(x, axis), ulps=2)


def test_softmax_of_an_overflowed_row_is_nan():
    """x * 1000 overflows fp16 to inf in row 1; softmax then gives NaN there, as on
    the device (ANE-C41); the other rows stay finite."""
    shape = (4, 64)
    x = f16(np.random.default_rng(1).standard_normal(shape) * 0.01)
    x[1, 5] = 100.0
    with np.errstate(over="ignore", invalid="ignore"):
        want = softmax_ref(f16(up(x) * 1000), -1)
    m = Mil()
    a = m.wrap_input("xa", shape)
    big = m.op("mul", shape, x=a, y=m.const(1000.0, "fp16"))
    r = m.op("softmax", shape, x=big, axis=m.const(-1, "int32"))
    outs = run(m.text([m.wrap_output(big, "ya"), m.wrap_output(r, "yb")]), {"xa": x},
               {"ya": shape, "yb": shape})
    assert np.isposinf(outs["ya"][1, 5])
    assert np.isnan(outs["yb"][1]).all()
    assert np.isfinite(outs["yb"][[0, 2, 3]]).all()
    assert np.isnan(want[1]).all()   # numpy's fp32 softmax agrees about row 1
    assert_f16_equal_ulps(outs["yb"][[0, 2, 3]], want[[0, 2, 3]], ulps=2)


# ---- strict numerics (ANE-C42) ---------------------------------------------------

def _conv_program(c: int, o: int, s: int, off: int) -> str:
    m = Mil()
    a = m.wrap_input("xa", (1, c, 1, s))
    wt = m.blob((o, c, 1, 1), WKEY, off)
    r = m.conv(a, wt, (1, o, 1, s))
    return m.text([m.wrap_output(r, "ya")])


def test_strict_rounds_each_product_to_fp16_and_flushes():
    """Products 2^-8 * 2^-8 = 2^-16 are fp16 denormals: strict numerics round each
    product to fp16 and flush it, so 64 of them sum to 0; the default accumulates
    exact products in fp32 and gives 64 * 2^-16 = 2^-10."""
    c, o, s = 64, 8, 32
    x = f16(np.full((1, c, 1, s), 2.0**-8))
    w = f16(np.full((o, c, 1, 1), 2.0**-8))
    blob, offs = blob_bytes([("w", w)])
    text = _conv_program(c, o, s, offs["w"])
    default = run(text, {"xa": x}, {"ya": (1, o, 1, s)}, "fp16", {WKEY: blob})["ya"]
    strict = run(text, {"xa": x}, {"ya": (1, o, 1, s)}, "strict", {WKEY: blob})["ya"]
    assert (default == np.float16(2.0**-10)).all()
    assert (strict == 0).all()


def test_strict_flushes_denormal_elementwise_results():
    shape = (4, 32)
    x = f16(np.full(shape, 2.0**-8))
    m = Mil()
    a = m.wrap_input("xa", shape)
    r = m.op("mul", shape, x=a, y=a)
    text = m.text([m.wrap_output(r, "ya")])
    default = run(text, {"xa": x}, {"ya": shape}, "fp16")["ya"]
    strict = run(text, {"xa": x}, {"ya": shape}, "strict")["ya"]
    assert (default == np.float16(2.0**-16)).all()
    assert (strict == 0).all()


@pytest.mark.parametrize("numerics", ["fp16", "strict"])
def test_strict_and_default_agree_on_normal_values(numerics):
    c, o, s = 32, 16, 32
    rng = np.random.default_rng(7)
    x = f16(rng.integers(-4, 5, (1, c, 1, s)))
    w = f16(rng.integers(-4, 5, (o, c, 1, 1)))
    blob, offs = blob_bytes([("w", w)])
    got = run(_conv_program(c, o, s, offs["w"]), {"xa": x}, {"ya": (1, o, 1, s)}, numerics,
              {WKEY: blob})["ya"]
    want = f16(up(w).reshape(o, c) @ up(x).reshape(c, s)).reshape(1, o, 1, s)
    assert_f16_equal_ulps(got, want, ulps=0)   # small integers: exact either way


def _all_fp16_in(lo: float, hi: float) -> np.ndarray:
    bits = np.arange(0, 0x10000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    vals = bits[np.isfinite(bits) & (bits >= lo) & (bits <= hi)]
    return np.concatenate([vals, np.array([np.inf, -np.inf, np.nan], np.float16)])


@pytest.mark.parametrize("op", ["exp", "sigmoid", "tanh"])
def test_exp_sigmoid_and_tanh_on_every_fp16_value(op):
    """vane's exp, sigmoid and tanh (looked up in a table of every fp16 result) against
    numpy's on every fp16 input in [-20, 12] (exp's results from denormal to overflow)
    and on inf, -inf, NaN."""
    x = _all_fp16_in(-20.0, 12.0)
    shape = (x.size,)
    m = Mil()
    r = m.op(op, shape, x=m.wrap_input("xa", shape))
    got = run(m.text([m.wrap_output(r, "ya")]), {"xa": x}, {"ya": shape})["ya"]
    with np.errstate(over="ignore"):
        want = f16(UNARY[op][0](up(x)))
    assert_f16_equal_ulps(got, want, ulps=1)


@pytest.mark.parametrize("op", ["exp", "sigmoid", "tanh"])
def test_fp16_table_equals_the_fp32_computation(op):
    """An fp16 tensor's exp, sigmoid and tanh come from a table of every fp16 input's
    result (vane_exec.c, unary_table); an fp32 tensor's are computed. The table must be
    the computation: the same bits, after the fp32 result's rounding to fp16, for all
    65,536 inputs, NaN included (any NaN for a NaN)."""
    x = np.arange(0, 0x10000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    shape = (x.size,)
    m = Mil()
    a = m.wrap_input("xa", shape)
    by_table = m.op(op, shape, x=a)
    wide = m.op("cast", shape, "fp32", x=a, dtype=m.const("fp32", "string"))
    computed = m.op("cast", shape, x=m.op(op, shape, "fp32", x=wide),
                    dtype=m.const("fp16", "string"))
    out = run(m.text([m.wrap_output(by_table, "ya"), m.wrap_output(computed, "yb")]),
              {"xa": x}, {"ya": shape, "yb": shape})
    got, want = out["ya"], out["yb"]
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
