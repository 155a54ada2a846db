"""Data movement on vane: reshape, transpose, slices, split, pad. Exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vane.milgen import Mil
from vane.refs import f16, run

pytestmark = pytest.mark.native

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shapes = st.lists(st.integers(1, 7), min_size=1, max_size=4).map(tuple)


def rand(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return f16(np.random.default_rng(seed).standard_normal(shape) * 8)


def one(m: Mil, value: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return run(m.text([m.wrap_output(value, "ya")]), {"xa": x}, {"ya": shape})["ya"]


@PROPS
@given(shape=shapes, data=st.data())
def test_reshape(shape, data):
    n = int(np.prod(shape))
    divs = [d for d in range(1, n + 1) if n % d == 0]
    a = data.draw(st.sampled_from(divs))
    new = (a, n // a) if data.draw(st.booleans()) else (1, a, 1, n // a)
    x = rand(shape)
    m = Mil()
    r = m.op("reshape", new, x=m.wrap_input("xa", shape), shape=m.const(list(new), "int32"))
    # consume it with an op so the alias is read through, not only copied out
    r = m.op("mul", new, x=r, y=m.const(2.0, "fp16"))
    np.testing.assert_array_equal(one(m, r, x, new), (x * 2).reshape(new))


@PROPS
@given(shape=shapes, data=st.data())
def test_transpose(shape, data):
    perm = data.draw(st.permutations(list(range(len(shape)))))
    x = rand(shape)
    out = tuple(shape[p] for p in perm)
    m = Mil()
    r = m.op("transpose", out, x=m.wrap_input("xa", shape), perm=m.const(list(perm), "int32"))
    np.testing.assert_array_equal(one(m, r, x, out), np.transpose(x, perm))


@st.composite
def index_slice(draw: st.DrawFn):
    shape = draw(shapes)
    begin, end, stride, bmask, emask, squeeze = [], [], [], [], [], []
    for d in shape:
        b = draw(st.integers(0, d - 1))
        e = draw(st.integers(b + 1, d))
        s = draw(st.integers(1, 3))
        bm, em = draw(st.booleans()), draw(st.booleans())
        lo, hi = (0 if bm else b), (d if em else e)
        n = -(-(hi - lo) // s)
        sq = n == 1 and draw(st.booleans())
        neg_b, neg_e = draw(st.booleans()), draw(st.booleans())
        begin.append(b - d if neg_b else b)
        end.append(e - d if (neg_e and e < d) else e)
        stride.append(s)
        bmask.append(bm)
        emask.append(em)
        squeeze.append(sq)
    return shape, begin, end, stride, bmask, emask, squeeze


@PROPS
@given(case=index_slice())
def test_slice_by_index(case):
    shape, begin, end, stride, bmask, emask, squeeze = case
    if all(squeeze):
        squeeze[0] = False
    x = rand(shape)
    idx = tuple(
        slice(None if bm else b, None if em else e, s)
        for b, e, s, bm, em in zip(begin, end, stride, bmask, emask, strict=True)
    )
    want = x[idx]
    want = want.reshape(tuple(n for n, q in zip(want.shape, squeeze, strict=True) if not q))
    m = Mil()
    r = m.op("slice_by_index", want.shape, x=m.wrap_input("xa", shape),
             begin=m.const(begin, "int32"), end=m.const(end, "int32"),
             stride=m.const(stride, "int32"), begin_mask=m.const(bmask, "bool"),
             end_mask=m.const(emask, "bool"), squeeze_mask=m.const(squeeze, "bool"))
    np.testing.assert_array_equal(one(m, r, x, want.shape), want)


@PROPS
@given(shape=shapes, data=st.data())
def test_slice_by_size(shape, data):
    begin = [data.draw(st.integers(0, d - 1)) for d in shape]
    size = [data.draw(st.sampled_from([-1, data.draw(st.integers(1, d - b))]))
            for d, b in zip(shape, begin, strict=True)]
    x = rand(shape)
    want = x[tuple(slice(b, None if z == -1 else b + z) for b, z in zip(begin, size, strict=True))]
    m = Mil()
    r = m.op("slice_by_size", want.shape, x=m.wrap_input("xa", shape),
             begin=m.const(begin, "int32"), size=m.const(size, "int32"))
    np.testing.assert_array_equal(one(m, r, x, want.shape), want)


@PROPS
@given(shape=shapes, data=st.data())
def test_split(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    d = shape[axis]
    equal = data.draw(st.booleans())
    if equal:
        n = data.draw(st.sampled_from([k for k in range(1, d + 1) if d % k == 0]))
        sizes = [d // n] * n
    else:
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, d - 1)), max_size=3)))
        cuts = [c for c in cuts if 0 < c < d]
        sizes = np.diff([0, *cuts, d]).tolist()
    x = rand(shape)
    parts = np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis)
    m = Mil()
    a = m.wrap_input("xa", shape)
    args = {"x": a, "axis": m.const(axis - len(shape) if data.draw(st.booleans()) else axis,
                                    "int32")}
    if equal:
        args["num_splits"] = m.const(len(sizes), "int32")
    else:
        args["split_sizes"] = m.const(sizes, "int32")
    names = m.multi("split", [(p.shape, "fp16") for p in parts], **args)
    outs = [m.wrap_output(nm, f"y{i:02d}") for i, nm in enumerate(names)]
    got = run(m.text(outs), {"xa": x}, {f"y{i:02d}": p.shape for i, p in enumerate(parts)})
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(got[f"y{i:02d}"], p)


@PROPS
@given(shape=shapes, data=st.data(), value=st.sampled_from([0.0, -1.5, 65504.0]))
def test_pad_constant(shape, data, value):
    k = data.draw(st.integers(1, len(shape)))
    pads = [data.draw(st.integers(0, 3)) for _ in range(2 * k)]
    x = rand(shape)
    width = [(0, 0)] * (len(shape) - k) + [(pads[2 * i], pads[2 * i + 1]) for i in range(k)]
    want = np.pad(x, width, constant_values=np.float16(value))
    m = Mil()
    r = m.op("pad", want.shape, x=m.wrap_input("xa", shape), pad=m.const(pads, "int32"),
             mode=m.const("constant", "string"), constant_val=m.const(value, "fp16"))
    np.testing.assert_array_equal(one(m, r, x, want.shape), want)


@pytest.mark.parametrize(("shape", "size", "aliased"), [
    ((1, 64, 1, 32), (1, 16, 1, 32), True),     # a program's block of a larger surface
    ((4, 6, 8), (1, 3, 8), True),               # one index of the leading axis, then rows
    ((4, 6), (4, 6), True),                     # the whole operand
    ((4, 6), (4, 5), False),                    # rows cut short: not contiguous
    ((4, 6, 8), (2, 3, 8), False),
])
def test_leading_prefix_slice_shares_its_operand(shape, size, aliased):
    """A slice of the operand's first elements is not run (it shares the bytes); any
    other is copied. Read through an op and as an output, both give the numpy slice."""
    x = rand(shape)
    want = x[tuple(slice(0, n) for n in size)]
    got, slices = _slices_run(shape, size, x, sliced=True)
    _, wrapping = _slices_run(shape, size, x, sliced=False)   # the I/O wrapping's own
    np.testing.assert_array_equal(got["ya"], want * 2)
    np.testing.assert_array_equal(got["yb"], want)
    assert (slices == wrapping) == aliased


def _slices_run(shape, size, x, sliced: bool):
    """Runs x -> [slice] -> (x2, itself); returns the outputs and the slice steps run."""
    from orion.runtime import vane_profile, vane_profile_read

    m = Mil()
    s = m.wrap_input("xa", shape)
    if sliced:
        s = m.op("slice_by_size", size, x=s, begin=m.const([0] * len(shape), "int32"),
                 size=m.const(list(size), "int32"))
    out = size if sliced else shape
    doubled = m.op("mul", out, x=s, y=m.const(2.0, "fp16"))
    text = m.text([m.wrap_output(doubled, "ya"), m.wrap_output(s, "yb")])
    vane_profile(True)
    try:
        got = run(text, {"xa": x}, {"ya": out, "yb": out})
        return got, sum(r.steps for r in vane_profile_read() if r.op == "slice_by_index")
    finally:
        vane_profile(False)
