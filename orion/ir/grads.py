"""Backward pieces: the activation gradients of the composites, built from the same ops.

Each function takes the forward operands it needs (recomputing cheap intermediates
rather than storing them) and the output gradient `dy`, and returns the input gradient.
Weight gradients are not here: training computes them on the host (DESIGN.md).
"""

from __future__ import annotations

import numpy as np

from orion.ir.composites import (
    GELU_C,
    causal_mask,
    gain,
    merge_heads,
    normalize,
    rope,
    split_heads,
    weight,
)
from orion.ir.graph import Graph, Value


def linear_backward(g: Graph, dy: Value, w: np.ndarray, name: str = "linear_bwd") -> Value:
    """dx = W^T dy, as a 1x1 conv with the transposed weight baked in."""
    with g.scope(name):
        return g.conv1x1(dy, weight(g, np.asarray(w, np.float32).T, "wt"))


def gelu_tanh_backward(g: Graph, x: Value, dy: Value, name: str = "gelu_bwd") -> Value:
    """dy * (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3a x^2)), t = tanh(c (x + a x^3))."""
    with g.composite("gelu_tanh_backward", name):
        x2 = g.mul(x, x, name="x2")
        z = g.mul(g.add(x, g.mul(g.mul(x2, x, name="x3"), 0.044715, name="cx3"), name="u"),
                  GELU_C, name="z")
        t = g.tanh(z, name="t")
        left = g.mul(g.add(t, 1.0, name="t1"), 0.5, name="left")
        sech2 = g.sub(1.0, g.mul(t, t, name="t2"), name="sech2")
        dz = g.mul(g.add(g.mul(x2, 3 * 0.044715, name="c3x2"), 1.0, name="dz1"), GELU_C,
                   name="dz")
        right = g.mul(g.mul(g.mul(x, 0.5, name="hx"), sech2, name="hxs"), dz, name="right")
        dx = g.mul(dy, g.add(left, right, name="deriv"), name="dx")
    return dx


def silu_backward(g: Graph, x: Value, dy: Value, name: str = "silu_bwd") -> Value:
    """dy * s (1 + x (1 - s)), s = sigmoid(x)."""
    with g.composite("silu_backward", name):
        s = g.sigmoid(x, name="sig")
        inner = g.add(g.mul(x, g.sub(1.0, s, name="one_s"), name="xs"), 1.0, name="inner")
        dx = g.mul(dy, g.mul(s, inner, name="deriv"), name="dx")
    return dx


def softmax_backward(g: Graph, p: Value, dp: Value, axis: int, name: str = "softmax_bwd") -> Value:
    """p * (dp - sum(dp * p)) along `axis`."""
    with g.scope(name):
        dot = g.reduce_sum(g.mul(dp, p, name="dpp"), axis, name="dot")
        return g.mul(p, g.sub(dp, dot, name="centred"), name="dx")


def layer_norm_backward(g: Graph, x: Value, gamma: np.ndarray | Value, dy: Value,
                        eps: float = 1e-5, name: str = "ln_bwd") -> Value:
    """inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma; inv
    applied as inv_s * inv_a so nothing squares x itself (see composites.normalize)."""
    with g.composite("layer_norm_backward", name):
        mean = g.reduce_mean(x, 1, name="mean")
        xhat, inv_s, inv_a = normalize(g, g.sub(x, mean, name="xc"), eps)
        dxhat = g.mul(dy, gain(g, gamma, "gamma"), name="dxhat")
        m1 = g.reduce_mean(dxhat, 1, name="m1")
        m2 = g.reduce_mean(g.mul(dxhat, xhat, name="dxx"), 1, name="m2")
        inner = g.sub(g.sub(dxhat, m1, name="c1"), g.mul(xhat, m2, name="xm2"), name="inner")
        dx = g.mul(g.mul(inner, inv_s, name="dx_s"), inv_a, name="dx")
    return dx


def rms_norm_backward(g: Graph, x: Value, gamma: np.ndarray | Value, dy: Value,
                      eps: float = 1e-5, name: str = "rms_bwd") -> Value:
    """inv * (dxhat - xhat * mean(dxhat * xhat)), dxhat = dy * gamma, xhat = x * inv.
    The textbook inv dxhat - x inv^3 mean(dxhat x) overflows fp16 in inv^3 once
    rms(x) < 0.025 (embeddings at init) and in x^2 once |x| > 255; this form squares
    neither (see composites.normalize)."""
    with g.composite("rms_norm_backward", name):
        xhat, inv_s, inv_a = normalize(g, x, eps)
        dxhat = g.mul(dy, gain(g, gamma, "gamma"), name="dxhat")
        m = g.reduce_mean(g.mul(dxhat, xhat, name="dxx"), 1, name="m")
        centred = g.sub(dxhat, g.mul(xhat, m, name="xm"), name="centred")
        dx = g.mul(g.mul(centred, inv_s, name="dx_s"), inv_a, name="dx")
    return dx


def causal_attention_backward(g: Graph, q: Value, k: Value, v: Value, dout: Value,
                              n_heads: int, name: str = "attn_bwd") -> tuple[Value, Value, Value]:
    """(dq, dk, dv), each [1, D, 1, S], of `causal_attention` with probabilities recomputed."""
    s = q.shape[3]
    scale = 1.0 / float(np.sqrt(q.shape[1] // n_heads))
    with g.composite("attention_backward", name):
        qh, kh, vh, doh = (split_heads(g, t, n_heads, n)
                           for t, n in ((q, "q"), (k, "k"), (v, "v"), (dout, "do")))
        scores = g.mul(g.matmul(qh, kh, transpose_y=True, name="scores"), scale, name="scaled")
        p = g.softmax(g.add(scores, g.const(causal_mask(s), name="mask"), name="masked"),
                      axis=-1, name="probs")
        dv = g.matmul(p, doh, transpose_x=True, name="dv")
        dp = g.matmul(doh, vh, transpose_y=True, name="dp")
        ds = g.mul(softmax_backward(g, p, dp, -1, name="sm"), scale, name="ds")
        dq = g.matmul(ds, kh, name="dq")
        dk = g.matmul(ds, qh, transpose_x=True, name="dk")
        out = tuple(merge_heads(g, t, n) for t, n in ((dq, "dq"), (dk, "dk"), (dv, "dv")))
    return out[0], out[1], out[2]


def rope_backward(g: Graph, dy: Value, n_heads: int, base: float = 10000.0,
                  name: str = "rope_bwd") -> Value:
    """RoPE is a rotation, so its backward is the rotation by the opposite angle."""
    return rope(g, dy, n_heads, base, inverse=True, name=name)
