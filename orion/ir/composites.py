"""Composite layers built from the 27 ops: what model code calls.

Activations are channel-first ``[1, C, 1, S]`` (ANE-C29): channels on axis 1, sequence on
the last axis. Each helper marks its nodes as one composite instance (``Graph.composite``)
so that passes can find, e.g., every layer norm's input (``insert_fp16_clamps``).
The forms follow ane-facts §2.5, which lists them as known to work on the device.
"""

from __future__ import annotations

import numpy as np

from orion.errors import InvalidArgumentError
from orion.ir.graph import Graph, Value

GELU_C = float(np.sqrt(2.0 / np.pi))
MASK_VALUE = -30000.0   # masked attention score: exp() of it is 0 in fp16, and it stays
                        # finite after adding any score below 35000 in magnitude


def weight(g: Graph, w: np.ndarray, name: str) -> Value:
    """A linear layer's [O, I] matrix as the conv weight [O, I, 1, 1]."""
    w = np.asarray(w)
    w = w if w.dtype == np.float16 else w.astype(np.float32, copy=False)   # see Graph.const
    return g.const(w.reshape(*w.shape[:2], 1, 1), name=name)


def channel_vector(g: Graph, v: np.ndarray, name: str) -> Value:
    """A per-channel vector (bias, gain) as [1, C, 1, 1]."""
    return g.const(np.asarray(v, dtype=np.float32).reshape(1, -1, 1, 1), name=name)


def linear(g: Graph, x: Value, w: np.ndarray, b: np.ndarray | None = None,
           name: str = "linear") -> Value:
    """y = W x + b as a 1x1 conv (ANE-C43: ~3x faster than matmul) plus a separate add
    (ANE-C05: conv takes no bias)."""
    with g.scope(name):
        y = g.conv1x1(x, weight(g, w, "w"))
        if b is not None:
            y = g.add(y, channel_vector(g, b, "b"))
    return y


NORM_FLOOR = 1e-4  # a row whose largest |value| is below this is scaled by this (no 1/0)


def gain(g: Graph, v: np.ndarray | Value, name: str) -> Value:
    """A per-channel gain or bias: a const from an array, or a Value as it is (an input)."""
    return v if isinstance(v, Value) else channel_vector(g, v, name)


def normalize(g: Graph, t: Value, eps: float) -> tuple[Value, Value, Value]:
    """t * (mean(t^2) + eps)^-0.5 over channels, safe in fp16 for any t it holds.

    The textbook form squares t, which overflows fp16 once |t| > 255 (or the channel
    sum of squares passes 65504: at C = 768, once rms(t) > 9.2). Here t is first
    divided by a = max|t|, so every square is at most 1:
        xhat = ts * (mean(ts^2) + eps / a^2)^-0.5,   ts = t / a,
    equal to the textbook value, with eps / a^2 formed as (sqrt(eps) / a)^2.
    Returns (xhat, inv_s, inv_a); the textbook (mean(t^2) + eps)^-0.5 is inv_s * inv_a.
    """
    mag = g.add(g.relu(t, name="pos"), g.relu(g.neg(t, name="nt"), name="negp"), name="abs")
    a = g.add(g.reduce_max(mag, 1, name="amax"), NORM_FLOOR, name="a")
    inv_a = g.pow(a, -1.0, name="inv_a")
    ts = g.mul(t, inv_a, name="ts")
    ms = g.reduce_mean(g.mul(ts, ts, name="sq"), 1, name="ms")
    e = g.mul(inv_a, float(np.sqrt(eps)), name="sqrt_eps_a")
    inv_s = g.pow(g.add(ms, g.mul(e, e, name="eps_a"), name="ms_eps"), -0.5, name="inv_s")
    return g.mul(ts, inv_s, name="xhat"), inv_s, inv_a


def layer_norm(g: Graph, x: Value, gamma: np.ndarray | Value, beta: np.ndarray | Value | None,
               eps: float = 1e-5, name: str = "ln") -> Value:
    """LayerNorm over channels: (x - mean) * (var + eps)^-0.5 * gamma + beta (fp16-safe,
    see `normalize`)."""
    with g.composite("layer_norm", name):
        mean = g.reduce_mean(x, 1, name="mean")
        xhat, _, _ = normalize(g, g.sub(x, mean, name="xc"), eps)
        y = g.mul(xhat, gain(g, gamma, "gamma"), name="scaled")
        if beta is not None:
            y = g.add(y, gain(g, beta, "beta"), name="y")
    return y


def rms_norm(g: Graph, x: Value, gamma: np.ndarray | Value, eps: float = 1e-5,
             name: str = "rms") -> Value:
    """RMSNorm over channels: x * (mean(x^2) + eps)^-0.5 * gamma (fp16-safe, see
    `normalize`)."""
    with g.composite("rms_norm", name):
        xhat, _, _ = normalize(g, x, eps)
        y = g.mul(xhat, gain(g, gamma, "gamma"), name="y")
    return y


def gelu_tanh(g: Graph, x: Value, name: str = "gelu") -> Value:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    with g.composite("gelu_tanh", name):
        x3 = g.mul(g.mul(x, x, name="x2"), x, name="x3")
        inner = g.mul(g.add(x, g.mul(x3, 0.044715, name="cx3"), name="u"), GELU_C, name="z")
        t = g.tanh(inner, name="t")
        y = g.mul(g.mul(x, 0.5, name="half"), g.add(t, 1.0, name="t1"), name="y")
    return y


def silu(g: Graph, x: Value, name: str = "silu") -> Value:
    """x * sigmoid(x)."""
    with g.composite("silu", name):
        y = g.mul(x, g.sigmoid(x, name="sig"), name="y")
    return y


def causal_mask(seq: int) -> np.ndarray:
    """[1, 1, S, S]: 0 where key <= query, MASK_VALUE above the diagonal."""
    m = np.triu(np.full((seq, seq), MASK_VALUE, dtype=np.float32), k=1)
    return m.reshape(1, 1, seq, seq)


def split_heads(g: Graph, x: Value, n_heads: int, name: str) -> Value:
    """[1, D, 1, S] -> [1, H, S, hd]."""
    d, s = x.shape[1], x.shape[3]
    if d % n_heads:
        raise InvalidArgumentError(f"split_heads: {d} channels do not divide into {n_heads} heads")
    h = g.reshape(x, (1, n_heads, d // n_heads, s), name=f"{name}_heads")
    return g.transpose(h, (0, 1, 3, 2), name=f"{name}_t")


def merge_heads(g: Graph, x: Value, name: str) -> Value:
    """[1, H, S, hd] -> [1, D, 1, S]."""
    _, h, s, hd = x.shape
    t = g.transpose(x, (0, 1, 3, 2), name=f"{name}_t")
    return g.reshape(t, (1, h * hd, 1, s), name=f"{name}_merged")


def causal_attention(g: Graph, q: Value, k: Value, v: Value, n_heads: int,
                     name: str = "attn") -> Value:
    """softmax(q k^T / sqrt(hd) + mask) v per head, for q, k, v [1, D, 1, S] (ane-facts
    §2.5; a hand-built attention, since SDPA ignores its mask, ANE-C07)."""
    s = q.shape[3]
    hd = q.shape[1] // n_heads
    with g.composite("attention", name):
        qh, kh, vh = (split_heads(g, t, n_heads, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
        scores = g.matmul(qh, kh, transpose_y=True, name="scores")
        scaled = g.mul(scores, 1.0 / float(np.sqrt(hd)), name="scaled")
        masked = g.add(scaled, g.const(causal_mask(s), name="mask"), name="masked")
        p = g.softmax(masked, axis=-1, name="probs")
        o = g.matmul(p, vh, name="o")
        y = merge_heads(g, o, "o")
    return y


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [1, 1, hd, S] for rotate-half RoPE (Llama, HF layout)."""
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.outer(np.arange(seq), inv)                       # [S, hd/2]
    ang = np.concatenate([ang, ang], axis=1).T                # [hd, S]
    return (np.cos(ang).astype(np.float32).reshape(1, 1, head_dim, seq),
            np.sin(ang).astype(np.float32).reshape(1, 1, head_dim, seq))


def rope(g: Graph, x: Value, n_heads: int, base: float = 10000.0, inverse: bool = False,
         name: str = "rope") -> Value:
    """Rotary embedding of x [1, D, 1, S]: x cos + rotate_half(x) sin per head, with
    rotate_half(x) = (-x2, x1). The halves are put back with pad + add rather than concat
    (ANE-C01). inverse=True rotates by -angle, which is also RoPE's backward."""
    d, s = x.shape[1], x.shape[3]
    hd = d // n_heads
    half = hd // 2
    cos, sin = rope_tables(s, hd, base)
    if inverse:
        sin = -sin
    with g.composite("rope", name):
        xh = g.reshape(x, (1, n_heads, hd, s), name="heads")
        x1 = g.slice(xh, (0, 0, 0, 0), (1, n_heads, half, s), name="x1")
        x2 = g.slice(xh, (0, 0, half, 0), (1, n_heads, half, s), name="x2")
        lo = g.mul(g.neg(x2, name="nx2"), g.const(sin[:, :, :half], name="sin_lo"), name="lo")
        hi = g.mul(x1, g.const(sin[:, :, half:], name="sin_hi"), name="hi")
        rot = g.add(g.pad(lo, ((0, 0), (0, 0), (0, half), (0, 0)), name="lo_p"),
                    g.pad(hi, ((0, 0), (0, 0), (half, 0), (0, 0)), name="hi_p"), name="rot")
        y = g.add(g.mul(xh, g.const(cos, name="cos"), name="xc"), rot, name="yh")
        y = g.reshape(y, (1, d, 1, s), name="y")
    return y


# ---- cross-entropy pieces --------------------------------------------------
# The IR has no log, so the loss itself is finished on the host from two per-position
# parts the device computes: loss = max + log(sum exp(logits - max)) - logit[target].


def logsumexp_parts(g: Graph, logits: Value, name: str = "lse") -> tuple[Value, Value]:
    """(max, sum exp(logits - max)) over the vocabulary (channel) axis, [1, 1, 1, S] each."""
    with g.composite("logsumexp", name):
        m = g.reduce_max(logits, 1, name="max")
        se = g.reduce_sum(g.exp(g.sub(logits, m, name="shifted"), name="e"), 1, name="sumexp")
    return m, se


def target_logit(g: Graph, logits: Value, onehot: Value, name: str = "target") -> Value:
    """logit of the target token per position, [1, 1, 1, S], from a one-hot [1, V, 1, S]."""
    with g.scope(name):
        return g.reduce_sum(g.mul(logits, onehot, name="picked"), 1, name="logit")


def cross_entropy_grad(g: Graph, logits: Value, onehot: Value, scale: float,
                       name: str = "xent_grad") -> Value:
    """d loss / d logits = (softmax(logits) - onehot) * scale (scale = 1 / positions for a
    mean loss)."""
    with g.composite("cross_entropy_grad", name):
        p = g.softmax(logits, axis=1, name="probs")
        d = g.mul(g.sub(p, onehot, name="diff"), scale, name="y")
    return d


def cross_entropy_from_parts(m: np.ndarray, sumexp: np.ndarray, target: np.ndarray,
                             valid: int | None = None) -> float:
    """Host side of the loss: mean over the first `valid` positions of
    max + log(sumexp) - target."""
    per = (np.asarray(m, np.float64) + np.log(np.asarray(sumexp, np.float64))
           - np.asarray(target, np.float64)).reshape(-1)
    return float(per[: valid if valid is not None else per.size].mean())
