import numpy as np
import pytest

from orion.errors import InvalidArgumentError
from orion.ir import Graph
from orion.ir.reference import evaluate, evaluate_all


def test_evaluates_each_op_like_numpy():
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((1, 8, 1, 32)).astype(np.float32)
    wv = rng.standard_normal((4, 8, 1, 1)).astype(np.float32)
    g = Graph("t")
    x = g.input("x", xv.shape)
    conv = g.conv1x1(x, g.const(wv))
    parts = g.split(x, [3, 5], axis=1)
    outs = {
        "conv": conv,
        "mm": g.matmul(g.reshape(x, (1, 1, 8, 32)), g.reshape(x, (1, 1, 8, 32)), transpose_x=True),
        "sm": g.softmax(x, axis=1),
        "pw": g.pow(g.add(g.mul(x, x), 1.0), -0.5),
        "rmax": g.reduce_max(x, 3),
        "sp1": parts[1],
        "pad": g.pad(x, ((0, 0), (1, 0), (0, 0), (0, 2))),
        "sl": g.slice(x, (0, 1, 0, 4), (1, 2, 1, 8)),
        "tr": g.transpose(x, (0, 3, 2, 1)),
        "cat": g.concat([x, x], axis=3),
        "clip": g.clip(x, -0.5, 0.5),
    }
    for k, v in outs.items():
        g.output(k, v)
    r = evaluate(g, {"x": xv})
    np.testing.assert_allclose(r["conv"], np.einsum("oi,bihs->bohs", wv[:, :, 0, 0], xv),
                               rtol=1e-5, atol=1e-5)
    xs = xv.reshape(8, 32)
    np.testing.assert_allclose(r["mm"][0, 0], xs.T @ xs, rtol=1e-5, atol=1e-4)
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    np.testing.assert_allclose(r["sm"], e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(r["pw"], 1 / np.sqrt(xv * xv + 1), rtol=1e-5)
    np.testing.assert_array_equal(r["rmax"], xv.max(axis=3, keepdims=True))
    np.testing.assert_array_equal(r["sp1"], xv[:, 3:])
    assert r["pad"].shape == (1, 9, 1, 34) and r["pad"][0, 0].sum() == 0
    np.testing.assert_array_equal(r["sl"], xv[:, 1:3, :, 4:12])
    np.testing.assert_array_equal(r["tr"], xv.transpose(0, 3, 2, 1))
    np.testing.assert_array_equal(r["cat"], np.concatenate([xv, xv], axis=3))
    assert r["clip"].max() <= 0.5 and r["clip"].min() >= -0.5


def test_round_fp16_rounds_between_ops():
    g = Graph("t")
    x = g.input("x", (1, 1, 1, 32))
    g.output("y", g.add(g.mul(x, 1.0), 1e-4))
    xv = np.full((1, 1, 1, 32), 1.0, np.float32)
    assert evaluate(g, {"x": xv})["y"][0, 0, 0, 0] == pytest.approx(1.0001)
    assert evaluate(g, {"x": xv}, round_fp16=True)["y"][0, 0, 0, 0] == 1.0


def test_feeds_are_checked():
    g = Graph("t")
    g.output("y", g.relu(g.input("x", (1, 2, 1, 32))))
    with pytest.raises(InvalidArgumentError, match="no feed for input 'x'"):
        evaluate_all(g, {})
    with pytest.raises(ValueError, match="expected"):
        evaluate(g, {"x": np.zeros((1, 3, 1, 32))})
