"""Transposes folded into the matmul that reads them (fold_transposes in
csrc/vane/vane_plan.c): the matmul reads the transpose's operand in place, so the
results must equal the unfolded program's, bit for bit, and the transpose must
not run when the matmul is its only reader."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orion.runtime import Program, vane_profile, vane_profile_read
from vane.milgen import Mil, from_io, to_io
from vane.refs import assert_dot_close, f16, up

pytestmark = pytest.mark.native

PERMS = [(0, 1, 2, 3), (0, 2, 1, 3), (0, 1, 3, 2), (0, 2, 3, 1), (1, 0, 3, 2), (0, 3, 1, 2)]


def program(xs, ys, px, py, tx, ty, out, keep_transpose: bool) -> str:
    """x, y transposed by px, py, then one matmul; keep_transpose also outputs the
    transposed x, which must stop that transpose from being folded."""
    m = Mil()
    a, b = m.wrap_input("xa", xs), m.wrap_input("xb", ys)
    xt = tuple(xs[p] for p in px)
    yt = tuple(ys[p] for p in py)
    ta = m.op("transpose", xt, x=a, perm=m.const(list(px), "int32"))
    tb = m.op("transpose", yt, x=b, perm=m.const(list(py), "int32"))
    r = m.op("matmul", out, x=ta, y=tb, transpose_x=m.const(tx, "bool"),
             transpose_y=m.const(ty, "bool"))
    outs = [m.wrap_output(r, "ya")]
    if keep_transpose:
        outs.append(m.wrap_output(ta, "yt"))
    return m.text(outs)


def reference(x, y, px, py, tx, ty):
    xe, ye = np.transpose(up(x), px), np.transpose(up(y), py)
    xe = np.swapaxes(xe, -1, -2) if tx else xe
    ye = np.swapaxes(ye, -1, -2) if ty else ye
    ref = np.matmul(xe.astype(np.float64), ye.astype(np.float64))
    scale = np.matmul(np.abs(xe).astype(np.float64), np.abs(ye).astype(np.float64))
    return ref, scale


@st.composite
def cases(draw: st.DrawFn):
    px, py = draw(st.sampled_from(PERMS)), draw(st.sampled_from(PERMS))
    b0, b1 = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    m, k, n = (draw(st.integers(1, 20)) for _ in range(3))
    tx, ty = draw(st.booleans()), draw(st.booleans())
    xt = (b0, b1) + ((k, m) if tx else (m, k))      # shapes after the transposes
    yt = (b0, b1) + ((n, k) if ty else (k, n))
    xs = tuple(xt[px.index(d)] for d in range(4))   # shapes before them
    ys = tuple(yt[py.index(d)] for d in range(4))
    return xs, ys, px, py, tx, ty, (b0, b1, m, n)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), seed=st.integers(0, 2**32 - 1))
def test_folded_matmul_matches_reference_and_unfolded(case, seed):
    xs, ys, px, py, tx, ty, out = case
    rng = np.random.default_rng(seed)
    x, y = f16(rng.standard_normal(xs)), f16(rng.standard_normal(ys))
    got = {}
    for keep in (False, True):
        text = program(xs, ys, px, py, tx, ty, out, keep)
        with Program.compile(text, backend="vane") as p:
            outs = p.run({"xa": to_io(x), "xb": to_io(y)})
        got[keep] = from_io(outs["ya"], out)
        if keep:
            np.testing.assert_array_equal(from_io(outs["yt"], tuple(xs[p] for p in px)),
                                          np.transpose(x, px))
    ref, scale = reference(x, y, px, py, tx, ty)
    assert_dot_close(got[False], f16(ref), scale)
    np.testing.assert_array_equal(got[False], got[True])


def transposes_run(text: str, feeds: dict[str, np.ndarray]) -> int:
    with Program.compile(text, backend="vane") as p:
        vane_profile(True)
        try:
            p.run(feeds)
            return sum(r.steps for r in vane_profile_read() if r.op == "transpose")
        finally:
            vane_profile(False)


def test_transpose_with_only_a_matmul_reader_does_not_run():
    xs, ys, px, py = (1, 4, 16, 16), (1, 40, 4, 16), (0, 1, 2, 3), (0, 2, 1, 3)
    out = (1, 4, 16, 40)   # more columns than VK_GEMV_MULTI_MAX: the GEMM path
    x, y = f16(np.ones(xs)), f16(np.ones(ys))
    feeds = {"xa": to_io(x), "xb": to_io(y)}
    # x's transpose is the identity permutation, still a transpose step
    assert transposes_run(program(xs, ys, px, py, False, True, out, False), feeds) == 0
    assert transposes_run(program(xs, ys, px, py, False, True, out, True), feeds) == 1


def test_a_few_columns_keep_the_left_transpose():
    """Up to VK_GEMV_MULTI_MAX (32) columns sum as GEMVs where the left operand's rows
    are contiguous (batch invariance of a few tokens): its transpose is left to run, the
    right one's is folded (its strides do not change the sums)."""
    k = 16
    for cols, runs in ((32, 1), (33, 0)):
        xs, ys, px, py = (1, 2, k, 16), (1, 2, cols, k), (0, 1, 3, 2), (0, 1, 3, 2)
        out = (1, 2, 16, cols)
        feeds = {"xa": to_io(f16(np.ones(xs))), "xb": to_io(f16(np.ones(ys)))}
        assert transposes_run(program(xs, ys, px, py, False, False, out, False), feeds) == runs


@pytest.mark.parametrize("out_rows, out_cols", [(8, 8), (16, 1), (1, 16)])
def test_a_few_rows_or_one_column_keep_their_transposes(out_rows, out_cols):
    """Such a product picks a vector kernel by its operands' strides (GEMV or vector x
    matrix), whose sums run in different orders: a fold would change its bits."""
    k = 16
    xs, ys, px, py = (1, 2, k, out_rows), (1, 2, k, out_cols), (0, 1, 3, 2), (0, 1, 2, 3)
    out = (1, 2, out_rows, out_cols)
    x, y = f16(np.ones(xs)), f16(np.ones(ys))
    feeds = {"xa": to_io(x), "xb": to_io(y)}
    assert transposes_run(program(xs, ys, px, py, False, False, out, False), feeds) == 2
