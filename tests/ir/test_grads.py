"""Backward pieces against central finite differences of the forward composites."""

import numpy as np
import pytest

from orion.ir import Graph, composites, grads
from orion.ir.reference import evaluate

RNG = np.random.default_rng(3)
C, S = 8, 32


def numeric_vjp(forward, xs, dy, i, eps=1e-6):
    """d sum(forward(xs) * dy) / d xs[i], by central differences in float64."""
    grad = np.zeros_like(xs[i])
    flat = grad.reshape(-1)
    for j in range(flat.size):
        hi, lo = [x.copy() for x in xs], [x.copy() for x in xs]
        hi[i].reshape(-1)[j] += eps
        lo[i].reshape(-1)[j] -= eps
        flat[j] = ((forward(hi) - forward(lo)) * dy).sum() / (2 * eps)
    return grad


def forward_fn(build, shapes):
    g = Graph("f")
    ins = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    g.output("y", build(g, *ins))
    return lambda xs: evaluate(g, {f"x{i}": x for i, x in enumerate(xs)}, np.float64)["y"]


def backward_value(build_bwd, shapes, xs, dy):
    g = Graph("b")
    ins = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    d = g.input("dy", dy.shape)
    outs = build_bwd(g, *ins, d)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for i, o in enumerate(outs):
        g.output(f"d{i}", o)
    feeds = {f"x{i}": x for i, x in enumerate(xs)} | {"dy": dy}
    r = evaluate(g, feeds, np.float64)
    return [r[f"d{i}"] for i in range(len(outs))]


GAMMA = RNG.standard_normal(C)
W = RNG.standard_normal((5, C))
CASES = {
    "linear": (lambda g, x: composites.linear(g, x, W, np.ones(5)),
               lambda g, x, dy: grads.linear_backward(g, dy, W)),
    "gelu": (lambda g, x: composites.gelu_tanh(g, x),
             lambda g, x, dy: grads.gelu_tanh_backward(g, x, dy)),
    "silu": (lambda g, x: composites.silu(g, x),
             lambda g, x, dy: grads.silu_backward(g, x, dy)),
    "layer_norm": (lambda g, x: composites.layer_norm(g, x, GAMMA, np.ones(C)),
                   lambda g, x, dy: grads.layer_norm_backward(g, x, GAMMA, dy)),
    "rms_norm": (lambda g, x: composites.rms_norm(g, x, GAMMA),
                 lambda g, x, dy: grads.rms_norm_backward(g, x, GAMMA, dy)),
    "softmax": (lambda g, x: g.softmax(x, axis=1),
                lambda g, x, dy: grads.softmax_backward(g, g.softmax(x, axis=1), dy, 1)),
    "rope": (lambda g, x: composites.rope(g, x, 2),
             lambda g, x, dy: grads.rope_backward(g, dy, 2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unary_backward_matches_finite_differences(case):
    fwd, bwd = CASES[case]
    shape = (1, C, 1, S)
    x = RNG.standard_normal(shape)
    out_shape = forward_fn(fwd, [shape])([x]).shape
    dy = RNG.standard_normal(out_shape)
    (got,) = backward_value(bwd, [shape], [x], dy)
    want = numeric_vjp(forward_fn(fwd, [shape]), [x], dy, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attention_backward_matches_finite_differences():
    shape = (1, C, 1, 16)
    xs = [RNG.standard_normal(shape) for _ in range(3)]
    dy = RNG.standard_normal(shape)
    fwd = forward_fn(lambda g, q, k, v: composites.causal_attention(g, q, k, v, 2), [shape] * 3)
    got = backward_value(lambda g, q, k, v, d: grads.causal_attention_backward(g, q, k, v, d, 2),
                         [shape] * 3, xs, dy)
    for i in range(3):
        np.testing.assert_allclose(got[i], numeric_vjp(fwd, xs, dy, i), rtol=1e-5, atol=1e-6)
