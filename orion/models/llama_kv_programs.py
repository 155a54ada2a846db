"""The inference programs of the Llama family, built with `orion.ir`: a prefill and a
decode program per layer (weights baked as consts) and a row head, the layout of
`orion.models.gpt2_programs` with grouped-query attention and RoPE.

prefill layer i, bucket S   x [1, D, 1, S] -> h [1, D, 1, S], k, v [1, KVD, 1, S]
    the prompt as one sequence from position 0 (padded to S, causal). k is after RoPE
    (and Qwen3's k norm): what the cache keeps.
decode layer i, cache T      x [1, R, 1, W] (the D channels folded into rows of the
                             surface width W = lcm(KVD, 32), zero-padded), k_cache,
                             v_cache [1, T*KVD/W, 1, W], mask [1, T, 1, 1], rope
                             [1, 2, 1, hd] (cos, signed sin of the position)
                             -> h [1, R, 1, W], k_new, v_new [1, 1, 1, KVD]
    one token against the cache. The cache is head-major, [KV, T, hd] from the first
    byte of its surface (`orion.models.kv_cache`), and holds the n_kv_heads heads only
    (KVD = n_kv_heads * head_dim): the program reads it as [1, KV, T, hd] by a
    reshape, so both attention products read each head's keys and values
    contiguously, and the query heads of a group attend to their shared key head as a
    [G, hd] block of one matmul, never an expanded copy. The new key and value join
    inside the program (one softmax over T + 1 scores) and are written into position
    `pos` by the host. The surfaces serve every bucket; the host lays the cache out
    again when a step moves to another bucket.
head                         x [1, R, 1, W] -> logits in vocabulary chunks
    final RMSNorm and the classifier, chunked to at most 32768 output channels per
    conv (ANE-C08) and each chunk folded to rows of 32 (ANE-C09).

LoRA: a layer program compiled for an adapter signature (`ProgramKey.lora`) takes the
adapter's A and B' as further inputs `lora0`, `lora1`, ... after the ones above,
folded into the same surface grid (`orion.lora.kv`), and adds B'(A x) to each adapted
linear layer; k_proj/v_proj keep their n_kv_heads rows.

GQA (ane-facts §2.5 attention): query head h belongs to key head h // G, as in
transformers' `repeat_kv`, so [1, H, S, hd] regroups to [1, KV, G*S, hd] by a reshape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from orion.ir import composites as C
from orion.ir.graph import Graph, Value
from orion.ir.legalize import ROW_ALIGN, surface_shape
from orion.lora.graph import Signature
from orion.lora.kv import KvLora, add_term
from orion.models import llama_rope
from orion.models.llama_config import LlamaConfig
from orion.models.llama_weights import layer_key

MASK_VALUE = C.MASK_VALUE
HEAD_CHUNK = 32768


@dataclass(frozen=True)
class ProgramKey:
    kind: str    # "prefill", "decode", "head"
    layer: int   # -1 for the head
    size: int    # S for prefill, T for decode, 1 for the head
    lora: Signature = ()   # the LoRA adapter's modules and ranks (orion.lora.kv)

    def name(self, tag: str) -> str:
        where = "head" if self.layer < 0 else f"l{self.layer:02d}"
        sig = "".join(f"_{m[0]}{m.split('_')[1][0]}{r}" for m, r in self.lora)
        return f"llama_{tag}_{where}_{self.kind}{self.size}{sig}"


@dataclass(frozen=True)
class RowLayout:
    """The grid of the decode surfaces: rows of `width` = lcm(KVD, 32) (KVD itself when
    it is a multiple of 32, ANE-C22), so a head-major cache [KV, T, hd] fills whole
    rows at every bucket T (a multiple of 32), and a [D] row folded into `rows` rows of
    it, zero-padded at the end when D is not a multiple of the width."""

    rows: int
    width: int

    @classmethod
    def of(cls, cfg: LlamaConfig) -> RowLayout:
        width = math.lcm(cfg.kv_dim, ROW_ALIGN)
        return cls(-(-cfg.dim // width), width)

    def cache_rows(self, cfg: LlamaConfig, cache: int) -> int:
        """Surface rows of a [KV, T, hd] cache of T = `cache` positions."""
        return cache * cfg.kv_dim // self.width

    def blocks(self, cfg: LlamaConfig, cache: int) -> list[tuple[int, int]]:
        """The (channels, width) blocks of a decode program's inputs."""
        cache_block = (self.cache_rows(cfg, cache), self.width)
        return [(self.rows, self.width), cache_block, cache_block, (cache, 1),
                (2, cfg.head_dim)]

    def surface(self, cfg: LlamaConfig, cache: int) -> tuple[int, int, int, int]:
        return surface_shape(self.blocks(cfg, cache))


def unfold_row(g: Graph, rows: Value, dim: int, name: str) -> Value:
    """[1, R, 1, W] (a row folded by `RowLayout`) -> the column [1, dim, 1, 1]."""
    col = g.reshape(rows, (1, rows.shape[1] * rows.shape[3], 1, 1), name=name)
    if col.shape[1] == dim:
        return col
    return g.slice(col, (0, 0, 0, 0), (1, dim, 1, 1), name=f"{name}_cut")


def fold_row(g: Graph, col: Value, lay: RowLayout, name: str) -> Value:
    """The column [1, D, 1, 1] -> [1, R, 1, W], zero-padded (the inverse of unfold_row)."""
    pad = lay.rows * lay.width - col.shape[1]
    if pad:
        col = g.pad(col, ((0, 0), (0, pad), (0, 0), (0, 0)), name=f"{name}_pad")
    return g.reshape(col, (1, lay.rows, 1, lay.width), name=name)


def rope_rows(cfg: LlamaConfig, start: int, n: int) -> np.ndarray:
    """[n, 2, hd]: cos and signed sin (-sin on the first half) of positions
    start .. start + n - 1, each row what `rope_row` gives for its position."""
    cos, sin = llama_rope.tables(cfg, np.arange(start, start + n))
    half = cfg.head_dim // 2
    signed = np.concatenate([-sin[:, :half], sin[:, half:]], axis=1)
    return np.stack([cos, signed], axis=1).astype(np.float32)


def rope_row(cfg: LlamaConfig, pos: int) -> np.ndarray:
    """[2, hd]: cos and signed sin (-sin on the first half) of one position."""
    return rope_rows(cfg, pos, 1)[0]


# ---- blocks -------------------------------------------------------------------------


def _swap_halves(g: Graph, x: Value, axis: int, name: str) -> Value:
    """[x1, x2] -> [x2, x1] along `axis` (pad + add, no concat: ANE-C01)."""
    shape = list(x.shape)
    half = shape[axis] // 2
    size = shape.copy()
    size[axis] = half
    lo_begin = [0] * 4
    hi_begin = [0] * 4
    hi_begin[axis] = half
    x1 = g.slice(x, lo_begin, size, name=f"{name}_x1")
    x2 = g.slice(x, hi_begin, size, name=f"{name}_x2")
    after = [(0, 0)] * 4
    before = [(0, 0)] * 4
    after[axis] = (0, half)
    before[axis] = (half, 0)
    return g.add(g.pad(x2, after, name=f"{name}_x2p"), g.pad(x1, before, name=f"{name}_x1p"),
                 name=f"{name}_swap")


def apply_rope(g: Graph, x: Value, cos: Value, sin_signed: Value, axis: int, name: str) -> Value:
    """x cos + rotate_half(x) sin, with rotate_half(x) = swap(x) * [-1.., +1..]."""
    with g.composite("rope", name):
        rot = g.mul(_swap_halves(g, x, axis, "r"), sin_signed, name="rot")
        y = g.add(g.mul(x, cos, name="xc"), rot, name="y")
    return y


def head_norm(g: Graph, x: Value, n_heads: int, gamma: np.ndarray, eps: float,
              name: str) -> Value:
    """RMSNorm of each head of x [1, n*hd, 1, S] over its hd channels (Qwen3)."""
    s, hd = x.shape[3], x.shape[1] // n_heads
    with g.scope(name):
        t = g.transpose(g.reshape(x, (1, n_heads, hd, s), name="heads"), (0, 2, 1, 3),
                        name="t")                                      # [1, hd, n, S]
        y = C.rms_norm(g, t, gamma, eps, "rms")
        y = g.transpose(y, (0, 2, 1, 3), name="back")
        return g.reshape(y, (1, n_heads * hd, 1, s), name="y")


class _Layer:
    """One layer's weights as graph pieces (fp32 arrays from a weights mapping), and
    the LoRA matrices (inputs) of the linear layers an adapter adapts."""

    def __init__(self, cfg: LlamaConfig, w: Mapping[str, np.ndarray], i: int,
                 lora: Mapping[str, tuple[Value, Value]] | None = None) -> None:
        self.cfg, self.w, self.i = cfg, w, i
        self.lora = lora or {}

    def linear(self, g: Graph, x: Value, param: str, bias: np.ndarray | None,
               name: str) -> Value:
        """W x (+ b), plus B'(A x) when `param` ("mlp.up_proj") is adapted."""
        y = C.linear(g, x, self.get(f"{param}.weight"), bias, name=name)
        mats = self.lora.get(param.rsplit(".", 1)[-1])
        return y if mats is None else add_term(g, x, y, mats, name)

    def get(self, suffix: str) -> np.ndarray:
        return self.w[layer_key(self.i, suffix)]

    def bias(self, proj: str, on: bool) -> np.ndarray | None:
        return self.get(f"self_attn.{proj}.bias") if on else None

    def qkv(self, g: Graph, x: Value) -> tuple[Value, Value, Value]:
        """q, k, v [1, *, 1, S] after the input norm and the projections, with the
        per-head q/k norms where the config has them (before RoPE, as Qwen3)."""
        c = self.cfg
        xn = C.rms_norm(g, x, self.get("input_layernorm.weight"), c.norm_eps, "att_norm")
        q = self.linear(g, xn, "self_attn.q_proj", self.bias("q_proj", c.qkv_bias), "wq")
        k = self.linear(g, xn, "self_attn.k_proj", self.bias("k_proj", c.qkv_bias), "wk")
        v = self.linear(g, xn, "self_attn.v_proj", self.bias("v_proj", c.qkv_bias), "wv")
        if c.qk_norm:
            q = head_norm(g, q, c.n_heads, self.get("self_attn.q_norm.weight"), c.norm_eps,
                          "q_norm")
            k = head_norm(g, k, c.n_kv_heads, self.get("self_attn.k_norm.weight"),
                          c.norm_eps, "k_norm")
        return q, k, v

    def finish(self, g: Graph, x: Value, attn: Value) -> Value:
        """x + o_proj(attn), then the SwiGLU block with its residual."""
        c = self.cfg
        h = g.add(x, self.linear(g, attn, "self_attn.o_proj", self.bias("o_proj", c.o_bias),
                                 "wo"), name="h_att")
        hn = C.rms_norm(g, h, self.get("post_attention_layernorm.weight"), c.norm_eps,
                        "ffn_norm")
        gate = self.linear(g, hn, "mlp.gate_proj", None, "w1")
        up = self.linear(g, hn, "mlp.up_proj", None, "w3")
        m = g.mul(C.silu(g, gate), up, name="m")
        return g.add(h, self.linear(g, m, "mlp.down_proj", None, "w2"), name="y")


# ---- graphs -------------------------------------------------------------------------


def prefill_layer_graph(cfg: LlamaConfig, w: Mapping[str, np.ndarray], layer: int,
                        name: str, seq: int, lora: KvLora | None = None) -> Graph:
    c = cfg
    nh, nkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
    groups = nh // nkv
    g = Graph(name)
    x = g.input("x", (1, c.dim, 1, seq))
    lw = _Layer(c, w, layer, lora.declare(g, c) if lora else None)
    q, k, v = lw.qkv(g, x)
    cos_t, sin_t = llama_rope.tables(c, np.arange(seq))                 # [S, hd]
    half = hd // 2
    sin_t = np.concatenate([-sin_t[:, :half], sin_t[:, half:]], axis=1)
    cos_c = g.const(cos_t.T.astype(np.float32).reshape(1, 1, hd, seq), name="rope_cos")
    sin_c = g.const(sin_t.T.astype(np.float32).reshape(1, 1, hd, seq), name="rope_sin")
    with g.composite("attention", "attn"):
        qh = apply_rope(g, g.reshape(q, (1, nh, hd, seq), name="q_heads"), cos_c, sin_c, 2,
                        "rope_q")
        kh = apply_rope(g, g.reshape(k, (1, nkv, hd, seq), name="k_heads"), cos_c, sin_c, 2,
                        "rope_k")
        k_out = g.reshape(kh, (1, c.kv_dim, 1, seq), name="k_rot")
        qg = g.reshape(g.transpose(qh, (0, 1, 3, 2), name="q_t"), (1, nkv, groups * seq, hd),
                       name="q_groups")                                 # [1, KV, G*S, hd]
        kt = g.transpose(kh, (0, 1, 3, 2), name="k_t")                  # [1, KV, S, hd]
        vh = g.reshape(v, (1, nkv, hd, seq), name="v_heads")            # [1, KV, hd, S]
        scores = g.matmul(qg, kt, transpose_y=True, name="scores")      # [1, KV, G*S, S]
        mask = np.tile(C.causal_mask(seq), (1, 1, groups, 1))
        masked = g.add(g.mul(scores, 1.0 / float(np.sqrt(hd)), name="scaled"),
                       g.const(mask, name="mask"), name="masked")
        p = g.softmax(masked, axis=-1, name="probs")
        o = g.matmul(p, vh, transpose_y=True, name="o")                 # [1, KV, G*S, hd]
        o = g.transpose(g.reshape(o, (1, nh, seq, hd), name="o_heads"), (0, 1, 3, 2),
                        name="o_t")
        attn = g.reshape(o, (1, c.q_dim, 1, seq), name="o_merged")
    g.output("h", lw.finish(g, x, attn))
    g.output("k", k_out)
    g.output("v", v)
    return g


def decode_layer_graph(cfg: LlamaConfig, w: Mapping[str, np.ndarray], layer: int,
                       name: str, cache: int, lora: KvLora | None = None) -> Graph:
    c = cfg
    nh, nkv, hd, kvd = c.n_heads, c.n_kv_heads, c.head_dim, c.kv_dim
    groups = nh // nkv
    lay = RowLayout.of(c)
    g = Graph(name)
    x_rows = g.input("x", (1, lay.rows, 1, lay.width))
    cache_block = (1, lay.cache_rows(c, cache), 1, lay.width)
    k_cache = g.input("k_cache", cache_block)
    v_cache = g.input("v_cache", cache_block)
    mask = g.input("mask", (1, cache, 1, 1))
    rope = g.input("rope", (1, 2, 1, hd))
    lw = _Layer(c, w, layer, lora.declare(g, c) if lora else None)
    x = unfold_row(g, x_rows, c.dim, "x_col")
    q, k, v = lw.qkv(g, x)
    cos = g.slice(rope, (0, 0, 0, 0), (1, 1, 1, hd), name="cos")
    sin = g.slice(rope, (0, 1, 0, 0), (1, 1, 1, hd), name="sin")
    with g.composite("attention", "attn"):
        qh = apply_rope(g, g.reshape(q, (1, nh, 1, hd), name="q_heads"), cos, sin, 3, "rope_q")
        kn = apply_rope(g, g.reshape(k, (1, nkv, 1, hd), name="k_heads"), cos, sin, 3,
                        "rope_k")                                       # [1, KV, 1, hd]
        vn = g.reshape(v, (1, nkv, 1, hd), name="v_heads")
        qg = g.reshape(qh, (1, nkv, groups, hd), name="q_groups")       # [1, KV, G, hd]
        kh = g.reshape(k_cache, (1, nkv, cache, hd), name="kc_heads")   # [1, KV, T, hd]
        vh = g.reshape(v_cache, (1, nkv, cache, hd), name="vc_heads")   # [1, KV, T, hd]
        old = g.add(g.matmul(qg, kh, transpose_y=True, name="scores"),  # [1, KV, G, T]
                    g.reshape(mask, (1, 1, 1, cache), name="mask_row"), name="masked")
        new = g.reduce_sum(g.mul(qg, kn, name="qk_new"), 3, name="score_new")  # [1,KV,G,1]
        joined = g.add(g.pad(old, ((0, 0), (0, 0), (0, 0), (0, 1)), name="old_p"),
                       g.pad(new, ((0, 0), (0, 0), (0, 0), (cache, 0)), name="new_p"),
                       name="joined")
        p = g.softmax(g.mul(joined, 1.0 / float(np.sqrt(hd)), name="scaled"), axis=-1,
                      name="probs")
        p_old = g.slice(p, (0, 0, 0, 0), (1, nkv, groups, cache), name="p_old")
        p_new = g.slice(p, (0, 0, 0, cache), (1, nkv, groups, 1), name="p_new")
        o = g.add(g.matmul(p_old, vh, name="o_old"),                    # [1, KV, G, hd]
                  g.mul(p_new, vn, name="o_new"), name="o")
        attn = g.reshape(o, (1, c.q_dim, 1, 1), name="o_col")
    h = lw.finish(g, x, attn)
    g.output("h", fold_row(g, h, lay, "h_rows"))
    g.output("k_new", g.reshape(kn, (1, 1, 1, kvd), name="k_row"))
    g.output("v_new", g.reshape(vn, (1, 1, 1, kvd), name="v_row"))
    return g


def head_chunks(vocab: int) -> list[tuple[int, int]]:
    """(first row, rows) of each classifier chunk."""
    return [(s, min(HEAD_CHUNK, vocab - s)) for s in range(0, vocab, HEAD_CHUNK)]


HEAD_FILL_ROWS = 4096   # classifier rows converted to fp32 at a time (16 MiB at dim 1024)


def head_graph(cfg: LlamaConfig, final_norm: np.ndarray,
               classifier_rows: Callable[[slice], np.ndarray], name: str) -> Graph:
    """`classifier_rows(rows)` gives fp32 rows of the classifier, a chunk at a time (a
    151,936-row table is not converted whole)."""
    lay = RowLayout.of(cfg)
    g = Graph(name)
    x = unfold_row(g, g.input("x", (1, lay.rows, 1, lay.width)), cfg.dim, "x_col")
    y = C.rms_norm(g, x, final_norm, cfg.norm_eps, "final_norm")
    for n, (start, rows) in enumerate(head_chunks(cfg.vocab_size)):
        padded = -(-rows // 32) * 32
        part = np.zeros((padded, cfg.dim), np.float16)   # the baked type; half of fp32
        for lo in range(0, rows, HEAD_FILL_ROWS):   # bounded fp32 temporaries
            hi = min(rows, lo + HEAD_FILL_ROWS)
            part[lo:hi] = classifier_rows(slice(start + lo, start + hi))
        logits = g.conv1x1(y, C.weight(g, part, f"w_head{n}"), name=f"logits{n}")
        g.output(f"logits{n}", g.reshape(logits, (1, padded // 32, 1, 32),
                                         name=f"logits{n}_rows"))
    return g
