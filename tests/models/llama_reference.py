"""Llama forward and backward in numpy: a test oracle the device path is compared
against (itself checked against PyTorch in test_llama_reference.py).

Arrays are token-major here: activations [B, S, D], linear weights [out, in]
(y = x W^T). Everything computes in the dtype of the weights given (fp32, or fp64 for
gradient checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from orion.models.architectures.llama import Args as LlamaConfig
from orion.train.loss import cross_entropy

Weights = dict[str, np.ndarray]
EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


def layer_key(i: int, suffix: str) -> str:
    return f"model.layers.{i}.{suffix}"

# ---- blocks ---------------------------------------------------------------------


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(x * inv * g, inv) with inv = (mean(x^2) + eps)^-1/2 over the last axis."""
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv * g, inv


def rms_norm_backward(dy: np.ndarray, x: np.ndarray, g: np.ndarray, inv: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dg) of `rms_norm`."""
    dg = np.sum(dy * x * inv, axis=tuple(range(dy.ndim - 1)))
    dxhat = dy * g
    dx = inv * dxhat - x * inv ** 3 * np.mean(dxhat * x, axis=-1, keepdims=True)
    return dx, dg


def rope_tables(seq: int, head_dim: int, theta: float, dtype: type = np.float32
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [S, hd] for rotate-half rotary embeddings."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.outer(np.arange(seq), inv)
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate_half_t(x: np.ndarray) -> np.ndarray:
    """The transpose of `rotate_half` (its inverse)."""
    half = x.shape[-1] // 2
    return np.concatenate([x[..., half:], -x[..., :half]], axis=-1)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [B, S, H, hd] rotated; cos, sin [S, hd]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def rope_backward(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    return dy * cos[:, None, :] + rotate_half_t(dy * sin[:, None, :])


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def silu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    s = 1.0 / (1.0 + np.exp(-x))
    return dy * s * (1.0 + x * (1.0 - s))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---- the model ------------------------------------------------------------------


@dataclass
class LayerCache:
    x: np.ndarray          # [B, S, D] layer input
    inv1: np.ndarray
    xn: np.ndarray         # attention norm output
    q: np.ndarray          # [B, H, S, hd] after RoPE
    k: np.ndarray          # [B, H, S, hd] after RoPE, kv heads repeated
    v: np.ndarray
    p: np.ndarray          # [B, H, S, S] attention probabilities
    att: np.ndarray        # [B, S, D] attention output before o_proj
    h: np.ndarray          # [B, S, D] after the attention residual
    inv2: np.ndarray
    hn: np.ndarray
    gate: np.ndarray       # [B, S, hidden] w1 output
    up: np.ndarray         # w3 output
    m: np.ndarray          # silu(gate) * up


@dataclass
class Cache:
    tokens: np.ndarray
    layers: list[LayerCache] = field(default_factory=list)
    xf: np.ndarray | None = None
    inv_f: np.ndarray | None = None
    xfn: np.ndarray | None = None


def _repeat_kv(x: np.ndarray, groups: int) -> np.ndarray:
    return x if groups == 1 else np.repeat(x, groups, axis=1)


def _reduce_kv(x: np.ndarray, groups: int) -> np.ndarray:
    if groups == 1:
        return x
    b, h, s, d = x.shape
    return x.reshape(b, h // groups, groups, s, d).sum(axis=2)


def causal_mask(seq: int, dtype: type = np.float32) -> np.ndarray:
    return np.triu(np.full((seq, seq), -np.inf, dtype), k=1)


def layer_forward(cfg: LlamaConfig, w: Mapping[str, np.ndarray], i: int, x: np.ndarray
                  ) -> tuple[np.ndarray, LayerCache]:
    b, s, d = x.shape
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    cos, sin = rope_tables(s, hd, cfg.rope_theta, x.dtype.type)
    xn, inv1 = rms_norm(x, w[layer_key(i, "input_layernorm.weight")], cfg.norm_eps)
    q = (xn @ w[layer_key(i, "self_attn.q_proj.weight")].T).reshape(b, s, nh, hd)
    k = (xn @ w[layer_key(i, "self_attn.k_proj.weight")].T).reshape(b, s, nkv, hd)
    v = (xn @ w[layer_key(i, "self_attn.v_proj.weight")].T).reshape(b, s, nkv, hd)
    q = rope(q, cos, sin).transpose(0, 2, 1, 3)
    k = _repeat_kv(rope(k, cos, sin).transpose(0, 2, 1, 3), nh // nkv)
    v = _repeat_kv(v.transpose(0, 2, 1, 3), nh // nkv)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + causal_mask(s, x.dtype.type)
    p = softmax(scores, -1)
    att = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
    h = x + att @ w[layer_key(i, "self_attn.o_proj.weight")].T
    hn, inv2 = rms_norm(h, w[layer_key(i, "post_attention_layernorm.weight")], cfg.norm_eps)
    gate = hn @ w[layer_key(i, "mlp.gate_proj.weight")].T
    up = hn @ w[layer_key(i, "mlp.up_proj.weight")].T
    m = silu(gate) * up
    y = h + m @ w[layer_key(i, "mlp.down_proj.weight")].T
    return y, LayerCache(x, inv1, xn, q, k, v, p, att, h, inv2, hn, gate, up, m)


def forward(cfg: LlamaConfig, w: Mapping[str, np.ndarray], tokens: np.ndarray
            ) -> tuple[np.ndarray, Cache]:
    """logits [B, S, V] for tokens [B, S], and what backward needs."""
    tokens = np.atleast_2d(tokens)
    x = w[EMBED][tokens]
    cache = Cache(tokens)
    for i in range(cfg.n_layers):
        x, lc = layer_forward(cfg, w, i, x)
        cache.layers.append(lc)
    xfn, inv_f = rms_norm(x, w[FINAL_NORM], cfg.norm_eps)
    cache.xf, cache.inv_f, cache.xfn = x, inv_f, xfn
    cls = w[EMBED] if cfg.tie_embeddings else w[LM_HEAD]
    return xfn @ cls.T, cache


def _linear_grad(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dW of y = x W^T over all leading axes: dy^T x."""
    return dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])


def layer_backward(cfg: LlamaConfig, w: Mapping[str, np.ndarray], i: int, lc: LayerCache,
                   dy: np.ndarray, grads: Weights) -> np.ndarray:
    b, s, d = dy.shape
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    groups = nh // nkv
    key = lambda suffix: layer_key(i, suffix)  # noqa: E731
    # feed-forward
    grads[key("mlp.down_proj.weight")] = _linear_grad(dy, lc.m)
    dm = dy @ w[key("mlp.down_proj.weight")]
    dgate = silu_backward(lc.gate, dm * lc.up)
    dup = dm * silu(lc.gate)
    grads[key("mlp.gate_proj.weight")] = _linear_grad(dgate, lc.hn)
    grads[key("mlp.up_proj.weight")] = _linear_grad(dup, lc.hn)
    dhn = dgate @ w[key("mlp.gate_proj.weight")] + dup @ w[key("mlp.up_proj.weight")]
    dh, grads[key("post_attention_layernorm.weight")] = rms_norm_backward(
        dhn, lc.h, w[key("post_attention_layernorm.weight")], lc.inv2)
    dh = dh + dy
    # attention
    grads[key("self_attn.o_proj.weight")] = _linear_grad(dh, lc.att)
    datt = (dh @ w[key("self_attn.o_proj.weight")]).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
    dv = lc.p.transpose(0, 1, 3, 2) @ datt
    dp = datt @ lc.v.transpose(0, 1, 3, 2)
    ds = lc.p * (dp - np.sum(dp * lc.p, axis=-1, keepdims=True)) / np.sqrt(hd)
    dq = ds @ lc.k
    dk = ds.transpose(0, 1, 3, 2) @ lc.q
    cos, sin = rope_tables(s, hd, cfg.rope_theta, dy.dtype.type)
    dq = rope_backward(dq.transpose(0, 2, 1, 3), cos, sin).reshape(b, s, d)
    dk = rope_backward(_reduce_kv(dk, groups).transpose(0, 2, 1, 3), cos, sin).reshape(b, s, -1)
    dv = _reduce_kv(dv, groups).transpose(0, 2, 1, 3).reshape(b, s, -1)
    grads[key("self_attn.q_proj.weight")] = _linear_grad(dq, lc.xn)
    grads[key("self_attn.k_proj.weight")] = _linear_grad(dk, lc.xn)
    grads[key("self_attn.v_proj.weight")] = _linear_grad(dv, lc.xn)
    dxn = (dq @ w[key("self_attn.q_proj.weight")] + dk @ w[key("self_attn.k_proj.weight")]
           + dv @ w[key("self_attn.v_proj.weight")])
    dx, grads[key("input_layernorm.weight")] = rms_norm_backward(
        dxn, lc.x, w[key("input_layernorm.weight")], lc.inv1)
    return dx + dh


def head_backward(cfg: LlamaConfig, w: Mapping[str, np.ndarray], cache: Cache,
                  dlogits: np.ndarray, grads: Weights) -> np.ndarray:
    """Classifier and final norm backward: d loss / d (last layer output)."""
    assert cache.xfn is not None and cache.xf is not None and cache.inv_f is not None
    cls = w[EMBED] if cfg.tie_embeddings else w[LM_HEAD]
    dcls = _linear_grad(dlogits, cache.xfn)
    grads[EMBED if cfg.tie_embeddings else LM_HEAD] = dcls
    dxfn = dlogits @ cls
    dx, grads[FINAL_NORM] = rms_norm_backward(dxfn, cache.xf, w[FINAL_NORM], cache.inv_f)
    return dx


def embedding_backward(cfg: LlamaConfig, tokens: np.ndarray, dx: np.ndarray,
                       grads: Weights) -> None:
    """Adds the embedding gradient (scatter-add of dx by token) into grads[EMBED]."""
    g = grads.get(EMBED)
    if g is None:
        g = grads[EMBED] = np.zeros((cfg.vocab_size, cfg.dim), dx.dtype)
    np.add.at(g, tokens.reshape(-1), dx.reshape(-1, cfg.dim))


def loss_and_grads(cfg: LlamaConfig, w: Mapping[str, np.ndarray], tokens: np.ndarray,
                   targets: np.ndarray) -> tuple[float, Weights]:
    """Mean cross-entropy of next-token prediction and the gradient of every parameter."""
    logits, cache = forward(cfg, w, tokens)
    loss, dlogits = cross_entropy(logits, np.atleast_2d(targets))
    grads: Weights = {}
    dx = head_backward(cfg, w, cache, dlogits.astype(logits.dtype), grads)
    for i in reversed(range(cfg.n_layers)):
        dx = layer_backward(cfg, w, i, cache.layers[i], dx, grads)
    embedding_backward(cfg, cache.tokens, dx, grads)
    return loss, grads
