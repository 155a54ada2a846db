"""The device programs of GPT-2, built with `orion.ir`.

Three kinds, each compiled once per model and size, then reused:

prefill layer i, bucket S   x [1, D, 1, S] -> h, k, v [1, D, 1, S]
    the whole prompt as one sequence (padded to S; causal attention keeps the real
    positions blind to the padding). Inputs and outputs share one device tensor, so
    layer i's h surface is layer i+1's input, with no host copy.
decode layer i, cache T      x [1, 1, 1, D], k_cache, v_cache [1, T, 1, D],
                             mask [1, T, 1, 1] -> h, k_new, v_new [1, 1, 1, D]
    one token against the KV cache. The cache is head-major: the T*D items from byte
    0 of its surface are [H, T, hd] (`orion.models.kv_cache`), so:
      - the program reads it as [1, H, T, hd] by a reshape, and both attention
        products read each head's keys and values contiguously (no transposes);
      - the legalized input tensor is [1, T', 1, D] with the cache packed from byte
        0, and a program for a smaller T reads a prefix of the same surfaces: one
        set of cache surfaces serves every decode bucket, laid out again by the
        host when a step moves to another bucket;
      - the new key and value are program outputs that the host writes into
        position `pos` of each head (2 * D fp16 per layer);
      - the new key and value join the cached ones inside the program (one softmax
        over T + 1 scores, `decode_attention`), and `mask` (0 before `pos`, -30000
        from it) hides the rows not yet written.
    Every input surface is allocated at one size (ANE-C18), and every one is over
    49152 bytes (ANE-C23) with width D, a multiple of 32 (ANE-C22/C24).
head, width W                x -> logits: final layer norm and the LM head
    (a [vocab, D] 1x1 conv, under the 65536-channel limit of ANE-C08/C09). W = 1 (the
    decode step and the last prompt position) takes a row [1, 1, 1, D] and gives a
    row [1, 1, 1, vocab]; W = S gives [1, vocab, 1, S] for every prompt position.

Program and weight names carry a per-model tag, so the weight keys are unique per
program and two models loaded in one process never share a program identifier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from orion.ir import composites as C
from orion.ir.graph import Graph, Value
from orion.ir.legalize import legalize_graph, legalize_program
from orion.ir.mil import EmittedProgram, emit
from orion.ir.program import program_from_graph
from orion.models.gpt2_weights import GPT2Config, GPT2Layer

MASK_VALUE = C.MASK_VALUE
HEAD_CHUNK = 4096    # LM head rows converted at a time


@dataclass(frozen=True)
class ProgramKey:
    kind: str    # "prefill", "decode", "head"
    layer: int   # -1 for the head
    size: int    # S for prefill and wide heads, T for decode, 1 for the row head

    def name(self, tag: str) -> str:
        where = "head" if self.layer < 0 else f"l{self.layer:02d}"
        return f"gpt2_{tag}_{where}_{self.kind}{self.size}"


# ---- blocks -------------------------------------------------------------------------


def layer_norm(g: Graph, x: Value, gamma: np.ndarray, beta: np.ndarray, eps: float,
               name: str) -> Value:
    """LayerNorm over channels, safe in fp16 for any input the fp16 range holds (GPT-2's
    residual stream has channels in the thousands): the compiler's own, which scales
    by the largest magnitude before squaring."""
    return C.layer_norm(g, x, gamma, beta, eps, name)


def qkv(g: Graph, a: Value, w: GPT2Layer, d: int) -> tuple[Value, Value, Value]:
    """q, k, v from one [3D, D] conv (one long GEMV streams its weights faster than
    three short ones), split on channels."""
    q, k, v = g.split(C.linear(g, a, w.w_qkv, w.b_qkv, name="qkv"), (d, d, d), axis=1,
                      name="qkv_split")
    return q, k, v


def mlp_block(g: Graph, x: Value, w: GPT2Layer, eps: float) -> Value:
    m = layer_norm(g, x, w.ln2_g, w.ln2_b, eps, "ln2")
    h = C.gelu_tanh(g, C.linear(g, m, w.w_fc, w.b_fc, name="fc"), name="gelu")
    return g.add(x, C.linear(g, h, w.w_out, w.b_out, name="out"), name="h")


# ---- graphs -------------------------------------------------------------------------


def prefill_attention(g: Graph, q: Value, k: Value, v: Value, n_heads: int) -> Value:
    """Causal attention over q, k, v [1, D, 1, S]: both matmuls take their second
    operand transposed (transpose_y), and v [1, D, 1, S] is already [1, H, hd, S]."""
    d, s = q.shape[1], q.shape[3]
    hd = d // n_heads
    with g.composite("attention", "attn"):
        qh = g.transpose(g.reshape(q, (1, n_heads, hd, s), name="q_heads"), (0, 1, 3, 2),
                         name="q_t")                                     # [1, H, S, hd]
        kh = g.transpose(g.reshape(k, (1, n_heads, hd, s), name="k_heads"), (0, 1, 3, 2),
                         name="k_t")                                     # [1, H, S, hd]
        vh = g.reshape(v, (1, n_heads, hd, s), name="v_heads")           # [1, H, hd, S]
        scores = g.matmul(qh, kh, transpose_y=True, name="scores")       # [1, H, S, S]
        scaled = g.mul(scores, 1.0 / float(np.sqrt(hd)), name="scaled")
        masked = g.add(scaled, g.const(C.causal_mask(s), name="mask"), name="masked")
        p = g.softmax(masked, axis=-1, name="probs")
        o = g.matmul(p, vh, transpose_y=True, name="o")                  # [1, H, S, hd]
        o = g.transpose(o, (0, 1, 3, 2), name="o_t")                     # [1, H, hd, S]
    return g.reshape(o, (1, d, 1, s), name="o_merged")


def prefill_layer_graph(c: GPT2Config, w: GPT2Layer, name: str, seq: int) -> Graph:
    d, eps = c.n_embd, c.layer_norm_epsilon
    g = Graph(name)
    x = g.input("x", (1, d, 1, seq))
    q, k, v = qkv(g, layer_norm(g, x, w.ln1_g, w.ln1_b, eps, "ln1"), w, d)
    o = prefill_attention(g, q, k, v, c.n_head)
    x2 = g.add(x, C.linear(g, o, w.w_proj, w.b_proj, name="proj"), name="x2")
    g.output("h", mlp_block(g, x2, w, eps))
    g.output("k", k)
    g.output("v", v)
    return g


def decode_attention(g: Graph, q: Value, k_row: Value, v_row: Value, k_cache: Value,
                     v_cache: Value, mask: Value, n_heads: int) -> Value:
    """One query against the head-major cache [1, T, 1, D] = [H, T, hd] (masked: 0
    before `pos`, MASK_VALUE from it) and against its own key, as one softmax over
    T + 1 scores. The new score joins the cache scores by pad + add (no concat,
    ANE-C01), so the cache is only read."""
    t, d = k_cache.shape[1], k_cache.shape[3]
    hd = d // n_heads
    with g.composite("attention", "attn"):
        qh = g.reshape(q, (1, n_heads, 1, hd), name="q_heads")           # [1, H, 1, hd]
        kh = g.reshape(k_cache, (1, n_heads, t, hd), name="k_heads")     # [1, H, T, hd]
        vh = g.reshape(v_cache, (1, n_heads, t, hd), name="v_heads")     # [1, H, T, hd]
        kn = g.reshape(k_row, (1, n_heads, 1, hd), name="k_new_heads")
        vn = g.reshape(v_row, (1, n_heads, 1, hd), name="v_new_heads")
        old = g.add(g.matmul(qh, kh, transpose_y=True, name="scores"),   # [1, H, 1, T]
                    g.reshape(mask, (1, 1, 1, t), name="mask_row"), name="masked")
        new = g.reduce_sum(g.mul(qh, kn, name="qk_new"), 3, name="score_new")  # [1, H, 1, 1]
        scale = 1.0 / float(np.sqrt(hd))
        joined = g.add(g.pad(old, ((0, 0), (0, 0), (0, 0), (0, 1)), name="old_p"),
                       g.pad(new, ((0, 0), (0, 0), (0, 0), (t, 0)), name="new_p"),
                       name="joined")
        p = g.softmax(g.mul(joined, scale, name="scaled"), axis=-1, name="probs")
        p_old = g.slice(p, (0, 0, 0, 0), (1, n_heads, 1, t), name="p_old")
        p_new = g.slice(p, (0, 0, 0, t), (1, n_heads, 1, 1), name="p_new")
        o = g.add(g.matmul(p_old, vh, name="o_old"),                     # [1, H, 1, hd]
                  g.mul(p_new, vn, name="o_new"), name="o")
    return g.reshape(o, (1, d, 1, 1), name="o_col")


def decode_layer_graph(c: GPT2Config, w: GPT2Layer, name: str, cache: int) -> Graph:
    d, eps = c.n_embd, c.layer_norm_epsilon
    g = Graph(name)
    x_row = g.input("x", (1, 1, 1, d))
    k_cache = g.input("k_cache", (1, cache, 1, d))
    v_cache = g.input("v_cache", (1, cache, 1, d))
    mask = g.input("mask", (1, cache, 1, 1))
    x = g.reshape(x_row, (1, d, 1, 1), name="x_col")
    q, k, v = qkv(g, layer_norm(g, x, w.ln1_g, w.ln1_b, eps, "ln1"), w, d)
    k_row = g.reshape(k, (1, 1, 1, d), name="k_row")
    v_row = g.reshape(v, (1, 1, 1, d), name="v_row")
    o = decode_attention(g, q, k_row, v_row, k_cache, v_cache, mask, c.n_head)
    x2 = g.add(x, C.linear(g, o, w.w_proj, w.b_proj, name="proj"), name="x2")
    h = mlp_block(g, x2, w, eps)
    g.output("h", g.reshape(h, (1, 1, 1, d), name="h_row"))
    g.output("k_new", k_row)
    g.output("v_new", v_row)
    return g


def head_graph(c: GPT2Config, lnf_g: np.ndarray, lnf_b: np.ndarray,
               head_rows: Callable[[slice], np.ndarray], name: str, width: int) -> Graph:
    """`head_rows(rows)` gives rows of the [vocab, D] LM head: the matrix is filled in
    fp16 (the device's type) a chunk at a time, never whole in fp32."""
    d = c.n_embd
    g = Graph(name)
    if width == 1:
        x = g.reshape(g.input("x", (1, 1, 1, d)), (1, d, 1, 1), name="x_col")
    else:
        x = g.input("x", (1, d, 1, width))
    y = layer_norm(g, x, lnf_g, lnf_b, c.layer_norm_epsilon, "ln_f")
    # A row [1, 1, 1, vocab] would break W <= 16384 (ANE-C09): for the row head the
    # vocabulary is padded with zero rows to a multiple of 32 and folded to
    # [1, V'/32, 1, 32], which the host reads back as one packed row.
    rows = row_vocab(c.vocab_size) if width == 1 else c.vocab_size
    head = np.zeros((rows, d), np.float16)
    for start in range(0, c.vocab_size, HEAD_CHUNK):
        part = slice(start, min(start + HEAD_CHUNK, c.vocab_size))
        head[part] = head_rows(part)
    head.setflags(write=False)   # frozen: the graph takes it without a copy
    logits = g.conv1x1(y, C.weight(g, head, "w_head"), name="logits")
    if width == 1:
        logits = g.reshape(logits, (1, rows // 32, 1, 32), name="logits_rows")
    g.output("logits", logits)
    return g


def row_vocab(vocab: int) -> int:
    """The vocabulary of the row head, padded to a multiple of 32."""
    return -(-vocab // 32) * 32


def lower(g: Graph) -> EmittedProgram:
    """One graph as one legal program: whole-graph passes, program passes, MIL."""
    program = program_from_graph(legalize_graph(g), g.name)
    return emit(legalize_program(program), share_weights=True)
