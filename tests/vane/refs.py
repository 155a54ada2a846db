"""Running MIL on vane and the numpy references it is compared with.

A reference rounds its inputs to fp16, computes in fp32 and rounds the result
to fp16, as the device does for one op."""

from __future__ import annotations

import numpy as np

from orion.runtime import Program
from vane.milgen import from_io, to_io

F16 = np.float16
F32 = np.float32


def f16(a: np.ndarray | float) -> np.ndarray:
    """fp32 -> fp16, round to nearest; past the fp16 range that is inf, as on the device."""
    with np.errstate(over="ignore"):
        return np.asarray(a, dtype=F32).astype(F16)


def up(a: np.ndarray) -> np.ndarray:
    """fp16 -> fp32, exactly."""
    return np.asarray(a, dtype=F16).astype(F32)


def run(text: str, feeds: dict[str, np.ndarray], out_shapes: dict[str, tuple[int, ...]],
        numerics: str = "fp16", weights: dict[str, bytes] | None = None) -> dict[str, np.ndarray]:
    """Compiles `text` on vane, feeds fp16 arrays of any shape, returns outputs by name."""
    with Program.compile(text, weights or {}, backend="vane", numerics=numerics) as p:
        outs = p.run({k: to_io(v) for k, v in feeds.items()})
    return {k: from_io(outs[k], s) for k, s in out_shapes.items()}


def assert_f16_equal_ulps(got: np.ndarray, want: np.ndarray, ulps: int = 1) -> None:
    """Equal within `ulps` units in the last place of fp16; NaN and inf must match."""
    got = np.asarray(got, dtype=F16)
    want = np.asarray(want, dtype=F16)
    assert got.shape == want.shape, (got.shape, want.shape)
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_g, nan_w), f"NaN positions differ: {np.argwhere(nan_g != nan_w)[:5]}"
    inf_g, inf_w = np.isinf(got), np.isinf(want)
    assert np.array_equal(got[inf_g | inf_w], want[inf_g | inf_w]), "inf values differ"
    ok = ~(nan_w | inf_w)
    g, w = got[ok].astype(np.float64), want[ok].astype(np.float64)
    tol = ulps * np.spacing(np.abs(want[ok])).astype(np.float64)
    bad = np.abs(g - w) > tol
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} differ by more than {ulps} ulp; first: "
        f"got {g[bad][:5]}, want {w[bad][:5]}"
    )


def assert_dot_close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, ulps: int = 1) -> None:
    """For fp32-accumulated products: the fp16 rounding of the result (half an
    ulp, twice: summation order can move a value across a rounding boundary)
    plus fp32 summation-order error relative to sum |a||b| (`scale`). `ulps` > 1
    for a result rounded more than once after the product (op chains)."""
    got = np.asarray(got, dtype=F16).astype(np.float64)
    want = np.asarray(want, dtype=F16).astype(np.float64)
    assert got.shape == want.shape
    tol = ulps * np.spacing(np.abs(want).astype(F16)).astype(np.float64) + 1e-5 * scale + 1e-7
    err = np.abs(got - want)
    assert (err <= tol).all(), f"max excess {np.max(err - tol)} at {np.argmax(err - tol)}"
