"""A numpy fp32 forward of GPT-2, the reference beside the device path in tests.

Independent of the device code: it reads the tensors by their transformers names, in
fp32 from the mapped file, and computes the textbook formulas (exact-erf GELU excepted:
GPT-2 uses the tanh form)."""

from __future__ import annotations

import numpy as np

P = "transformer."


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def forward(args, w, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of the whole sequence, causal attention, no cache.
    `args`: the model's TransformerArgs; `w`: its weights (`WeightSource`, linear
    layers [out, in])."""
    n, d, h = len(ids), args.dim, args.n_heads
    hd = d // h
    eps = args.norm_eps
    x = w.fp32(P + "wte.weight")[np.asarray(ids)] + w.fp32(P + "wpe.weight")[:n]
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    for i in range(args.n_layers):
        def t(name: str, i: int = i) -> np.ndarray:
            return w.fp32(f"{P}h.{i}.{name}")

        a = layer_norm(x, t("ln_1.weight"), t("ln_1.bias"), eps)
        qkv = a @ t("attn.c_attn.weight").T + t("attn.c_attn.bias")
        q, k, v = (u.reshape(n, h, hd).transpose(1, 0, 2) for u in np.split(qkv, 3, axis=-1))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        scores -= scores.max(-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(n, d)
        x = x + o @ t("attn.c_proj.weight").T + t("attn.c_proj.bias")
        m = layer_norm(x, t("ln_2.weight"), t("ln_2.bias"), eps)
        x = x + gelu_tanh(m @ t("mlp.c_fc.weight").T + t("mlp.c_fc.bias")) \
            @ t("mlp.c_proj.weight").T + t("mlp.c_proj.bias")
    x = layer_norm(x, w.fp32(P + "ln_f.weight"), w.fp32(P + "ln_f.bias"), eps)
    head = "lm_head.weight" if not args.tie_embeddings else P + "wte.weight"
    return (x @ w.fp32(head).T).astype(np.float32)
