"""Model blocks built with the IR, shared by the tests and the compile benchmark, and
their independent numpy references."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orion.ir import Graph, Value, composites


@dataclass
class GPT2Weights:
    ln1_g: np.ndarray
    ln1_b: np.ndarray
    w_qkv: np.ndarray    # [3D, D]
    b_qkv: np.ndarray
    w_proj: np.ndarray   # [D, D]
    b_proj: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray
    w_fc: np.ndarray     # [4D, D]
    b_fc: np.ndarray
    w_out: np.ndarray    # [D, 4D]
    b_out: np.ndarray

    @staticmethod
    def random(d: int, hidden: int, rng: np.random.Generator) -> GPT2Weights:
        def n(*shape: int, s: float = 0.02) -> np.ndarray:
            return (rng.standard_normal(shape) * s).astype(np.float32)
        return GPT2Weights(1 + n(d, s=0.1), n(d), n(3 * d, d), n(3 * d), n(d, d), n(d),
                           1 + n(d, s=0.1), n(d), n(hidden, d), n(hidden), n(d, hidden), n(d))


def gpt2_block(g: Graph, x: Value, w: GPT2Weights, n_heads: int, name: str) -> Value:
    """x + attn(ln_1(x)), then + mlp(ln_2(.)), GPT-2 style, on [1, D, 1, S]."""
    d = x.shape[1]
    with g.scope(name):
        h = composites.layer_norm(g, x, w.ln1_g, w.ln1_b, name="ln_1")
        qkv = composites.linear(g, h, w.w_qkv, w.b_qkv, name="c_attn")
        q, k, v = g.split(qkv, [d, d, d], axis=1, name="qkv")
        a = composites.causal_attention(g, q, k, v, n_heads)
        x = g.add(x, composites.linear(g, a, w.w_proj, w.b_proj, name="c_proj"), name="res1")
        h = composites.layer_norm(g, x, w.ln2_g, w.ln2_b, name="ln_2")
        h = g.gelu(composites.linear(g, h, w.w_fc, w.b_fc, name="c_fc"), name="gelu")
        x = g.add(x, composites.linear(g, h, w.w_out, w.b_out, name="mlp_proj"), name="res2")
    return x


def gpt2_stack(n_layers: int, d: int, hidden: int, n_heads: int, seq: int, seed: int = 0
               ) -> tuple[Graph, list[GPT2Weights]]:
    rng = np.random.default_rng(seed)
    weights = [GPT2Weights.random(d, hidden, rng) for _ in range(n_layers)]
    g = Graph("gpt2")
    x = g.input("x", (1, d, 1, seq))
    for i, w in enumerate(weights):
        x = gpt2_block(g, x, w, n_heads, f"h{i}")
    g.output("y", x)
    return g, weights


# ---- numpy reference (token-major [S, D], float64), written from the GPT-2 equations ----


def _ln(x: np.ndarray, gam: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * gam + b


def gpt2_block_reference(x_cs: np.ndarray, w: GPT2Weights, n_heads: int) -> np.ndarray:
    """x [1, D, 1, S] -> the block output, same layout."""
    x = x_cs[0, :, 0].T.astype(np.float64)            # [S, D]
    s, d = x.shape
    hd = d // n_heads
    qkv = _ln(x, w.ln1_g, w.ln1_b) @ w.w_qkv.T + w.b_qkv
    q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(s, n_heads, hd).transpose(1, 0, 2)
               for i in range(3))
    att = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    att = np.where(np.tril(np.ones((s, s), bool)), att, -np.inf)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    y = (att @ v).transpose(1, 0, 2).reshape(s, d)
    x = x + y @ w.w_proj.T + w.b_proj
    h = _ln(x, w.ln2_g, w.ln2_b) @ w.w_fc.T + w.b_fc
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    x = x + h @ w.w_out.T + w.b_out
    return x.T.reshape(1, d, 1, s)


# ---- Llama ---------------------------------------------------------------------------


@dataclass
class LlamaWeights:
    g1: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    g2: np.ndarray
    w1: np.ndarray   # gate [F, D]
    w3: np.ndarray   # up [F, D]
    w2: np.ndarray   # down [D, F]

    @staticmethod
    def random(d: int, hidden: int, rng: np.random.Generator) -> LlamaWeights:
        def n(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        return LlamaWeights(1 + 0.1 * n(d), n(d, d), n(d, d), n(d, d), n(d, d), 1 + 0.1 * n(d),
                            n(hidden, d), n(hidden, d), n(d, hidden))


def llama_block(g: Graph, x: Value, w: LlamaWeights, n_heads: int) -> Value:
    n = composites.rms_norm(g, x, w.g1, name="attn_norm")
    q = composites.rope(g, composites.linear(g, n, w.wq, name="wq"), n_heads, name="rope_q")
    k = composites.rope(g, composites.linear(g, n, w.wk, name="wk"), n_heads, name="rope_k")
    v = composites.linear(g, n, w.wv, name="wv")
    a = composites.causal_attention(g, q, k, v, n_heads)
    h = g.add(x, composites.linear(g, a, w.wo, name="wo"), name="h")
    m = composites.rms_norm(g, h, w.g2, name="ffn_norm")
    gate = composites.silu(g, composites.linear(g, m, w.w1, name="w1"))
    up = composites.linear(g, m, w.w3, name="w3")
    return g.add(h, composites.linear(g, g.mul(gate, up), w.w2, name="w2"), name="out")


def llama_block_backward(g: Graph, x: Value, dy: Value, w: LlamaWeights, n_heads: int) -> Value:
    """dx of `llama_block` for the output gradient dy, forward activations recomputed."""
    from orion.ir import grads

    n = composites.rms_norm(g, x, w.g1, name="attn_norm")
    q = composites.rope(g, composites.linear(g, n, w.wq, name="wq"), n_heads, name="rope_q")
    k = composites.rope(g, composites.linear(g, n, w.wk, name="wk"), n_heads, name="rope_k")
    v = composites.linear(g, n, w.wv, name="wv")
    a = composites.causal_attention(g, q, k, v, n_heads)
    h = g.add(x, composites.linear(g, a, w.wo, name="wo"), name="h")
    m = composites.rms_norm(g, h, w.g2, name="ffn_norm")
    pre = composites.linear(g, m, w.w1, name="w1")
    up = composites.linear(g, m, w.w3, name="w3")
    # mlp
    dmul = grads.linear_backward(g, dy, w.w2, name="w2_bwd")
    dpre = grads.silu_backward(g, pre, g.mul(dmul, up), name="silu_bwd")
    dup = g.mul(dmul, composites.silu(g, pre))
    dm = g.add(grads.linear_backward(g, dpre, w.w1, name="w1_bwd"),
               grads.linear_backward(g, dup, w.w3, name="w3_bwd"))
    dh = g.add(dy, grads.rms_norm_backward(g, h, w.g2, dm, name="ffn_norm_bwd"))
    # attention
    da = grads.linear_backward(g, dh, w.wo, name="wo_bwd")
    dq, dk, dv = grads.causal_attention_backward(g, q, k, v, da, n_heads)
    dq = grads.rope_backward(g, dq, n_heads, name="rope_q_bwd")
    dk = grads.rope_backward(g, dk, n_heads, name="rope_k_bwd")
    dn = g.add(g.add(grads.linear_backward(g, dq, w.wq, name="wq_bwd"),
                     grads.linear_backward(g, dk, w.wk, name="wk_bwd")),
               grads.linear_backward(g, dv, w.wv, name="wv_bwd"))
    return g.add(dh, grads.rms_norm_backward(g, x, w.g1, dn, name="attn_norm_bwd"), name="dx")


def llama_block_reference(x_cs: np.ndarray, w: LlamaWeights, n_heads: int) -> np.ndarray:
    """Token-major float64 Llama block (HF rotate-half RoPE), [1, D, 1, S] in and out."""
    x = x_cs[0, :, 0].T.astype(np.float64)
    s, d = x.shape
    hd = d // n_heads

    def rms(t: np.ndarray, gam: np.ndarray) -> np.ndarray:
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + 1e-5) * gam

    inv = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    ang = np.concatenate([np.outer(np.arange(s), inv)] * 2, axis=1)      # [S, hd]

    def rope(t: np.ndarray) -> np.ndarray:                               # [H, S, hd]
        rot = np.concatenate([-t[..., hd // 2:], t[..., : hd // 2]], axis=-1)
        return t * np.cos(ang) + rot * np.sin(ang)

    n = rms(x, w.g1)
    q, k, v = ((n @ m.T).reshape(s, n_heads, hd).transpose(1, 0, 2) for m in (w.wq, w.wk, w.wv))
    q, k = rope(q), rope(k)
    att = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    att = np.where(np.tril(np.ones((s, s), bool)), att, -np.inf)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    h = x + (att @ v).transpose(1, 0, 2).reshape(s, d) @ w.wo.T
    m = rms(h, w.g2)
    a = m @ w.w1.T
    out = h + ((a / (1 + np.exp(-a))) * (m @ w.w3.T)) @ w.w2.T
    return out.T.reshape(1, d, 1, s)
