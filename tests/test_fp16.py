"""Host fp16 conversion on vane's kernels: the same bits as numpy's astype."""

from __future__ import annotations

import numpy as np
import pytest

from orion.runtime.fp16 import to_fp16, to_fp32, transpose

pytestmark = pytest.mark.native

EDGES = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, -65520, 6.1e-5, 6e-8,
                  3e-8, 2.98e-8, 1e-9, 1.0 + 2**-11, 1.0 + 3 * 2**-11, np.nan], np.float32)


@pytest.mark.parametrize("n", [0, 1, 17, 1 << 18, (1 << 19) + 3])   # several work items too
def test_to_fp16_matches_numpy_bit_for_bit(n):
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * rng.choice([1e-6, 1.0, 1e3, 1e5], n)).astype(np.float32)
    a[: min(n, EDGES.size)] = EDGES[: min(n, EDGES.size)]
    with np.errstate(over="ignore"):
        want = a.astype(np.float16)
    got = to_fp16(a)
    assert got.dtype == np.float16 and got.shape == a.shape
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint16), want[finite].view(np.uint16))
    assert np.all(np.isnan(got[~finite]))


def test_to_fp32_is_exact_for_every_fp16_value():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got, want = to_fp32(every), every.astype(np.float32)
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    assert np.all(np.isnan(got[~finite]))


def test_into_out_and_shapes():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    out = np.empty((2, 3, 4), np.float16)
    assert to_fp16(a, out=out) is out
    assert np.array_equal(out, a.astype(np.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        to_fp16(a, out=np.empty((4, 3, 2), np.float16).T)
    with pytest.raises(ValueError, match="float16"):
        to_fp16(a, out=np.empty(24, np.float32))


@pytest.mark.parametrize("shape", [(1, 1), (1, 70), (70, 1), (37, 53), (64, 64), (100, 200),
                                   (2048, 768), (768, 2048)])
def test_transpose_matches_numpy(shape):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float16)
    got = transpose(a)
    assert got.flags.c_contiguous and got.shape == shape[::-1]
    assert np.array_equal(got.view(np.uint16), a.T.view(np.uint16))
    out = np.empty(shape[::-1], np.float16)
    assert transpose(a, out=out) is out


def test_transpose_refuses_bad_arguments():
    a = np.zeros((4, 6), np.float16)
    with pytest.raises(ValueError, match="2-D"):
        transpose(np.zeros(5, np.float16))
    with pytest.raises(ValueError, match=r"\(6, 4\)"):
        transpose(a, out=np.empty((4, 6), np.float16))
    square = np.zeros((4, 4), np.float16)
    with pytest.raises(ValueError, match="overlaps"):
        transpose(square, out=square)
