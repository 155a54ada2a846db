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
