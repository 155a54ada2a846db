"""Composites against independent numpy formulas (not the IR reference's own code)."""

import numpy as np
import pytest

from orion.ir import Graph, Op, composites
from orion.ir.reference import evaluate

RNG = np.random.default_rng(2)
C, S = 16, 32


def run(build, *shapes):
    g = Graph("t")
    xs = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    g.output("y", build(g, *xs))
    feeds = {f"x{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    return g, [feeds[f"x{i}"] for i in range(len(shapes))], evaluate(g, feeds, np.float64)["y"]


def test_linear_is_conv_plus_bias():
    w, b = RNG.standard_normal((8, C)), RNG.standard_normal(8)
    g, (x,), y = run(lambda g, x: composites.linear(g, x, w, b), (1, C, 1, S))
    np.testing.assert_allclose(y[0, :, 0], w @ x[0, :, 0] + b[:, None], rtol=1e-5, atol=1e-5)
    assert [n.op for n in g.nodes if n.op not in (Op.INPUT, Op.CONST)] == [Op.CONV1X1, Op.ADD]


def test_layer_norm():
    gamma, beta = RNG.standard_normal(C), RNG.standard_normal(C)
    g, (x,), y = run(lambda g, x: composites.layer_norm(g, x, gamma, beta), (1, C, 1, S))
    xs = x[0, :, 0].astype(np.float64)
    mu, var = xs.mean(0), xs.var(0)
    want = (xs - mu) / np.sqrt(var + 1e-5) * gamma[:, None] + beta[:, None]
    np.testing.assert_allclose(y[0, :, 0], want, rtol=1e-5, atol=1e-6)
    assert {n.group for n in g.nodes if n.op not in (Op.INPUT,)} == {("layer_norm", 0)}


def test_rms_norm():
    gamma = RNG.standard_normal(C)
    _, (x,), y = run(lambda g, x: composites.rms_norm(g, x, gamma), (1, C, 1, S))
    xs = x[0, :, 0].astype(np.float64)
    want = xs / np.sqrt((xs * xs).mean(0) + 1e-5) * gamma[:, None]
    np.testing.assert_allclose(y[0, :, 0], want, rtol=1e-5, atol=1e-6)


def test_gelu_tanh_and_silu():
    _, (x,), y = run(lambda g, x: composites.gelu_tanh(g, x), (1, C, 1, S))
    xd = x.astype(np.float64)
    want = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd**3)))
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
    _, (x,), y = run(lambda g, x: composites.silu(g, x), (1, C, 1, S))
    np.testing.assert_allclose(y, x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


def attention_reference(q, k, v, h):
    d, s = q.shape[1], q.shape[3]
    hd = d // h
    qh, kh, vh = (t.reshape(h, hd, s).transpose(0, 2, 1).astype(np.float64) for t in (q, k, v))
    scores = qh @ kh.transpose(0, 2, 1) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1).reshape(1, d, 1, s)


def test_causal_attention():
    shape = (1, C, 1, S)
    _, (q, k, v), y = run(lambda g, q, k, v: composites.causal_attention(g, q, k, v, 4),
                          shape, shape, shape)
    np.testing.assert_allclose(y, attention_reference(q, k, v, 4), rtol=1e-5, atol=1e-6)


def test_rope_matches_rotate_half():
    h, hd = 2, C // 2
    _, (x,), y = run(lambda g, x: composites.rope(g, x, h), (1, C, 1, S))
    pos = np.arange(S)
    inv = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    ang = np.concatenate([np.outer(pos, inv)] * 2, axis=1).T        # [hd, S]
    xh = x.reshape(h, hd, S).astype(np.float64)
    rot = np.concatenate([-xh[:, hd // 2:], xh[:, : hd // 2]], axis=1)
    want = (xh * np.cos(ang) + rot * np.sin(ang)).reshape(1, C, 1, S)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_cross_entropy_pieces():
    v, s = 50, S
    g = Graph("t")
    logits = g.input("logits", (1, v, 1, s))
    onehot = g.input("onehot", (1, v, 1, s))
    m, se = composites.logsumexp_parts(g, logits)
    g.output("m", m)
    g.output("se", se)
    g.output("t", composites.target_logit(g, logits, onehot))
    g.output("d", composites.cross_entropy_grad(g, logits, onehot, 1.0 / s))
    lv = RNG.standard_normal((1, v, 1, s)).astype(np.float32) * 3
    targets = RNG.integers(0, v, s)
    oh = np.zeros((1, v, 1, s), np.float32)
    oh[0, targets, 0, np.arange(s)] = 1
    r = evaluate(g, {"logits": lv, "onehot": oh}, np.float64)
    lt = lv[0, :, 0].T.astype(np.float64)                           # [S, V]
    lse = np.log(np.exp(lt).sum(1))
    loss = float((lse - lt[np.arange(s), targets]).mean())
    assert abs(composites.cross_entropy_from_parts(r["m"], r["se"], r["t"]) - loss) < 1e-9
    p = np.exp(lt - lse[:, None])
    p[np.arange(s), targets] -= 1
    np.testing.assert_allclose(r["d"][0, :, 0].T, p / s, rtol=1e-6, atol=1e-9)


@pytest.mark.native
@pytest.mark.parametrize("scale", [0.01, 1.0, 40.0, 3000.0])
def test_rms_norm_and_its_backward_stay_finite_in_fp16(scale):
    """On vane (fp16 between ops): the textbook x * (sum(x^2)/C + eps)^-0.5 is inf once
    the channel sum of squares passes 65504 (C = 768: rms 9.2) and its backward's inv^3
    once rms < 0.025; the compiler's forms scale by max|x| first."""
    from orion.ir import grads
    from orion.ir.compile import compile_graph

    c, s = 768, 32
    r = np.random.default_rng(3)
    x = (r.standard_normal((1, c, 1, s)) * scale).astype(np.float16).astype(np.float64)
    dy = r.standard_normal((1, c, 1, s)).astype(np.float16).astype(np.float64)
    gamma = r.uniform(0.5, 1.5, c)
    g = Graph("rms_fp16")
    xi, dyi = g.input("x", x.shape), g.input("dy", dy.shape)
    g.output("y", composites.rms_norm(g, xi, gamma))
    g.output("dx", grads.rms_norm_backward(g, xi, gamma, dyi))
    with compile_graph(g) as cg:
        out = cg.run({"x": x.astype(np.float32), "dy": dy.astype(np.float32)})
    xs, dys = x[0, :, 0], dy[0, :, 0]
    inv = 1 / np.sqrt((xs * xs).mean(0) + 1e-5)
    xhat = xs * inv
    want_y = xhat * gamma[:, None]
    dxhat = dys * gamma[:, None]
    want_dx = inv * (dxhat - xhat * (dxhat * xhat).mean(0))
    assert np.all(np.isfinite(out["y"])) and np.all(np.isfinite(out["dx"]))
    np.testing.assert_allclose(out["y"][0, :, 0], want_y, atol=0.02 * np.abs(want_y).max())
    np.testing.assert_allclose(out["dx"][0, :, 0], want_dx, atol=0.02 * np.abs(want_dx).max())
