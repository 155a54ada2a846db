"""A numpy fp32 forward of GPT-2, the reference beside the device path in tests.

Independent of the device code: it reads the same `GPT2Weights`, in fp32 from the
mapped file, and computes the textbook formulas (exact-erf GELU excepted: GPT-2 uses
the tanh form)."""

from __future__ import annotations

import numpy as np

from orion.models.gpt2_weights import GPT2Config, GPT2Weights


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def forward(config: GPT2Config, w: GPT2Weights, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of the whole sequence, causal attention, no cache."""
    n, d, h = len(ids), config.n_embd, config.n_head
    hd = d // h
    x = w.embed(np.asarray(ids), 0)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    for i in range(config.n_layer):
        layer = w.layer(i, np.float32)
        a = layer_norm(x, layer.ln1_g, layer.ln1_b, config.layer_norm_epsilon)
        qkv = a @ layer.w_qkv.T + layer.b_qkv
        q, k, v = (t.reshape(n, h, hd).transpose(1, 0, 2) for t in np.split(qkv, 3, axis=-1))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        scores -= scores.max(-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(n, d)
        x = x + o @ layer.w_proj.T + layer.b_proj
        m = layer_norm(x, layer.ln2_g, layer.ln2_b, config.layer_norm_epsilon)
        x = x + gelu_tanh(m @ layer.w_fc.T + layer.b_fc) @ layer.w_out.T + layer.b_out
    x = layer_norm(x, *w.final_norm(), config.layer_norm_epsilon)
    return (x @ w.head_rows(slice(None), np.float32).T).astype(np.float32)
