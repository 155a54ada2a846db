"""The inference programs of every architecture, built from its blocks. A layer program
runs consecutive layers [first, first + n) (`orion.models.plan` chooses n: one layer, or
as many as the weight bound per program takes):

prefill layers, bucket S     x [1, D, 1, S] -> h [1, D, 1, S], then k, v [1, KVD, 1, S]
                             of each layer
    the prompt as one sequence from position 0 (padded to S, causal). k is after RoPE
    (and a q/k norm): what the cache keeps.
decode layers, cache T       x [1, R, 1, W] (the D channels folded into rows of the
                             surface width W = lcm(KVD, 32), zero-padded), then of each
                             layer k_cache, v_cache [1, T*KVD/W, 1, W], then a mask
                             [1, T, 1, 1] per attention window and, for rotary layers, a
                             rope [1, 2, 1, hd] (cos, signed sin of the position) per
                             RoPE -> h [1, R, 1, W], then k_new, v_new [1, 1, 1, KVD] of
                             each layer
    one token against the cache. The cache is head-major, [KV, T, hd] from the first
    byte of its surface (`orion.models.kv_cache`), and holds the n_kv_heads heads only:
    the program reads it as [1, KV, T, hd] by a reshape, so both attention products
    read each head's keys and values contiguously, and the query heads of a group
    attend to their shared key head as a [G, hd] block of one matmul, never an
    expanded copy. The new key and value join inside the program (one softmax over
    T + 1 scores) and are written into position `pos` by the host. The surfaces serve
    every bucket; the host lays the cache out again when a step moves to another.
    Inside a program, a layer's h is the next layer's x as it is (no fold, no copy).
head part                    x [1, R, 1, W] -> logits in vocabulary chunks
    the final norm and the classifier chunks of the plan's head part, at most 32768
    output channels per conv (ANE-C08), each chunk folded to rows of 32 (ANE-C09).

LoRA: a layer program compiled for an adapter signature (`ProgramKey.lora`) takes each
layer's A and B' as further inputs after the ones above (`lora0`, `lora1`, ... of a
one-layer program; `l<i>_lora0`, ... of a group), folded into the same surface grid
(`orion.models.adapters.KvLora`).

Every program is lowered by the one pipeline (`orion.ir.compile.lower_graph`: whole-
graph passes, the partitioner, program passes, MIL) and must come out as one program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import PlanError
from orion.ir import composites as C
from orion.ir.graph import Graph, Value
from orion.ir.mil import EmittedProgram
from orion.ir.partition import DeviceLimits
from orion.models.architecture import Architecture
from orion.models.blocks import (
    Decode,
    Lora,
    Prefill,
    RowLayout,
    Weights,
    fold_row,
    fold_rows,
    unfold_row,
    unfold_rows,
)
from orion.models.plan import BLOB_LIMIT_BYTES, head_chunks
from orion.models.rope import Rope

HEAD_FILL_ROWS = 4096   # classifier rows converted at a time (16 MiB at dim 1024)
# One inference program per plan entry: as large as the device loads (a blob under
# 4 GiB, ANE-C36), never cut by the partitioner (a cut would need host copies between
# its parts on every token); `orion.models.plan` decides what goes in a program.
INFERENCE_LIMITS = DeviceLimits(max_weight_bytes=BLOB_LIMIT_BYTES - 1, max_ops=1 << 20)


def _scope(g: Graph, layers: range, i: int) -> object:
    """Node names of layer i in a program of several layers start with l<i>."""
    from contextlib import nullcontext

    return g.scope(f"l{i}") if len(layers) > 1 else nullcontext()


def _suffix(layers: range, i: int) -> str:
    return f"_l{i}" if len(layers) > 1 else ""


def prefill_graph(arch: Architecture, weights: Weights, layers: range | int, name: str,
                  seq: int, lora_in: object | None = None) -> Graph:
    """`lora_in` is an `orion.models.adapters.KvLora` (its inputs are declared after x)."""
    layers = _range(layers)
    g = Graph(name)
    x = g.input("x", (1, arch.args.dim, 1, seq))
    loras = {i: _declare(lora_in, g, arch, layers, i) for i in layers}
    cache: list[tuple[Value, Value]] = []
    for i in layers:
        with _scope(g, layers, i):
            b = Prefill(g, arch, i, weights, loras[i])
            x = arch.layer(b, x)
        cache.append((b.cache_k, b.cache_v))
    g.output("h", x)
    for i, (k, v) in zip(layers, cache, strict=True):
        g.output(f"k{_suffix(layers, i)}", k)
        g.output(f"v{_suffix(layers, i)}", v)
    return g


def group_windows(arch: Architecture, layers: range) -> list[int]:
    """The attention windows of a program's layers, in the order of its mask inputs."""
    return list(dict.fromkeys(arch.attention(i).window for i in layers))


def group_ropes(arch: Architecture, layers: range) -> list[Rope]:
    """The RoPEs of a program's rotary layers, in the order of its rope inputs."""
    return list(dict.fromkeys(r for i in layers if (r := arch.attention(i).rope) is not None))


StepInputs = tuple[dict[int, tuple[Value, Value]], dict[int, Value], dict[Rope, Value]]


def declare_step_inputs(g: Graph, arch: Architecture, layers: range, cache_rows: int,
                        mask: tuple[int, int], rope_rows: int) -> StepInputs:
    """The inputs a KV-cache step declares after x, in binding order: each layer's
    k_cache, v_cache [1, cache_rows, 1, W], a mask [1, mask[0], 1, mask[1]] per
    attention window and a rope [1, rope_rows, 1, hd] per RoPE (decode's, verify's
    and batch's programs differ only in these shapes)."""
    a, lay = arch.args, RowLayout.of(arch)
    block = (1, cache_rows, 1, lay.width)
    kv = {i: (g.input(f"k_cache{_suffix(layers, i)}", block),
              g.input(f"v_cache{_suffix(layers, i)}", block)) for i in layers}
    windows, ropes = group_windows(arch, layers), group_ropes(arch, layers)
    one = len(windows) == 1
    masks = {w: g.input("mask" if one else f"mask_w{w}", (1, mask[0], 1, mask[1]))
             for w in windows}
    rope_in = {r: g.input("rope" if len(ropes) == 1 else f"rope{n}",
                          (1, rope_rows, 1, a.head_dim)) for n, r in enumerate(ropes)}
    return kv, masks, rope_in


def step_layers(g: Graph, arch: Architecture, layers: range, x: Value,
                block: Callable[[int], Any], h_out: Callable[[Value], Value]) -> Graph:
    """x through `layers`, each layer's block made and attached by `block(i)` in the
    layer's scope, then the outputs: h (`h_out` of the last hidden state) and each
    layer's k_new, v_new."""
    new: list[tuple[Value, Value]] = []
    for i in layers:
        with _scope(g, layers, i):
            b = block(i)
            x = arch.layer(b, x)
        new.append((b.k_new, b.v_new))
    g.output("h", h_out(x))
    for i, (k, v) in zip(layers, new, strict=True):
        g.output(f"k_new{_suffix(layers, i)}", k)
        g.output(f"v_new{_suffix(layers, i)}", v)
    return g


def rope_input(rope_in: dict[Rope, Value], arch: Architecture, i: int) -> Value | None:
    """Layer i's rope input, None for a layer without RoPE."""
    r = arch.attention(i).rope
    return rope_in[r] if r is not None else None


def decode_graph(arch: Architecture, weights: Weights, layers: range | int, name: str,
                 cache: int, lora_in: object | None = None) -> Graph:
    layers = _range(layers)
    a = arch.args
    lay = RowLayout.of(arch)
    g = Graph(name)
    x_rows = g.input("x", (1, lay.rows, 1, lay.width))
    kv, masks, rope_in = declare_step_inputs(g, arch, layers, lay.cache_rows(a.kv_dim, cache),
                                             (cache, 1), 2)
    loras = {i: _declare(lora_in, g, arch, layers, i) for i in layers}

    def block(i: int) -> Decode:
        b = Decode(g, arch, i, weights, loras[i])
        b.attach(cache, *kv[i], masks[arch.attention(i).window], rope_input(rope_in, arch, i))
        return b

    return step_layers(g, arch, layers, unfold_row(g, x_rows, a.dim, "x_col"), block,
                       lambda h: fold_row(g, h, lay, "h_rows"))


def _range(layers: range | int) -> range:
    return range(layers, layers + 1) if isinstance(layers, int) else layers


def _declare(lora_in: object | None, g: Graph, arch: Architecture, layers: range,
             i: int) -> Lora:
    if lora_in is None:
        return {}
    prefix = f"l{i}_" if len(layers) > 1 else ""
    return lora_in.declare(g, arch, prefix)  # type: ignore[attr-defined]


def head_graph(arch: Architecture, weights: Weights, name: str,
               chunks: Sequence[tuple[int, int]] | None = None) -> Graph:
    """The final norm and the classifier chunks `chunks` (every chunk of the vocabulary
    by default) of one row; the classifier is read in fp16 a chunk at a time (a
    151,936-row table is never converted whole)."""
    a = arch.args
    lay = RowLayout.of(arch)
    g = Graph(name)
    x = unfold_row(g, g.input("x", (1, lay.rows, 1, lay.width)), a.dim, "x_col")
    y = arch.final_norm(Prefill(g, arch, -1, weights), x)
    for n, (start, rows) in enumerate(chunks or head_chunks(a.vocab_size)):
        logits = head_product(g, y, arch, weights, n, start, rows)
        g.output(f"logits{n}", g.reshape(logits, (1, logits.shape[1] // 32, 1, 32),
                                         name=f"logits{n}_rows"))
    return g


def head_product(g: Graph, y: Value, arch: Architecture, weights: Weights, n: int,
                 start: int, rows: int) -> Value:
    """Classifier rows [start, start + rows) times y [1, D, 1, S] as a 1x1 conv:
    [1, rows padded to 32, 1, S]; a palettized classifier's per-channel scale
    multiplies the product after the conv (ANE-C57)."""
    w, post = head_weight(g, arch, weights, n, start, rows)
    logits = g.conv1x1(y, w, name=f"logits{n}")
    return logits if post is None else g.mul(logits, post, name=f"logits{n}_scaled")


def head_weight(g: Graph, arch: Architecture, weights: Weights, n: int, start: int,
                rows: int) -> tuple[Value, Value | None]:
    """Classifier rows [start, start + rows) as the conv weight const `w_head<n>`
    [rows padded to 32, D, 1, 1]: compressed as a quantized source holds them (with a
    palettized one's per-channel scale, [1, padded, 1, 1], second), else fp16 (the
    baked type; half of fp32), filled a bounded slice at a time."""
    source = weights.source
    dim = arch.args.dim
    padded = -(-rows // 32) * 32
    # the chunk's rows alone: a 151,936-row table is never built whole for one chunk
    compressed = source.quant(arch.classifier_name, slice(start, start + rows))
    if compressed is not None:
        part = compressed.rows(0, rows, padded)
        w = g.const(part.unscaled().with_shape((padded, dim, 1, 1)), name=f"w_head{n}")
        if part.post_scale is None:
            return w, None
        return w, C.channel_vector(g, part.post_scale, f"w_head{n}_scale")
    part = np.zeros((padded, dim), np.float16)
    for lo in range(0, rows, HEAD_FILL_ROWS):
        hi = min(rows, lo + HEAD_FILL_ROWS)
        part[lo:hi] = source.fp16(arch.classifier_name,  # type: ignore[union-attr]
                                  slice(start + lo, start + hi))
    part.setflags(write=False)
    return g.const(part.reshape(padded, dim, 1, 1), name=f"w_head{n}"), None


def lower(g: Graph, weights_folder: Path | None = None) -> EmittedProgram:
    """One graph as one legal program (see the module docstring); its weight file
    written in `weights_folder` when given (`orion.ir.mil.emit`)."""
    from orion.ir.compile import lower_graph

    lowered = lower_graph(g, INFERENCE_LIMITS, share_weights=True,
                          weights_folder=weights_folder)
    if len(lowered.emitted) != 1 or len(lowered.plan.stages) != 1:
        raise PlanError(f"{g.name} lowers to {len(lowered.plan.stages)} stages; an "
                           "inference program must be one")
    return lowered.emitted[0]


# ---- verify: K rows of one sequence in one eval (speculative decoding) --------------
#
# verify layers, cache T, K rows  x [1, K*R, 1, W] (K rows of D folded as decode's x,
#                              one after another), then of each layer k_cache, v_cache
#                              as decode binds them, a mask [1, T, 1, K] per window, a
#                              rope [1, 2K, 1, hd] per RoPE -> h [1, D, 1, K], then
#                              k_new, v_new [1, KVD, 1, K] of each layer
#     positions p .. p+K-1 of one sequence against the cache [0, p) (`blocks.Verify`).
#     The inputs stay within decode's surfaces (x folded: D rows could pass them).
# verify head, K rows          x [1, D, 1, K] -> logits [1, rows, 1, K] in the head
#                              part's vocabulary chunks


def verify_graph(arch: Architecture, weights: Weights, layers: range | int, name: str,
                 cache: int, rows: int) -> Graph:
    from orion.models.blocks import Verify

    layers = _range(layers)
    a = arch.args
    lay = RowLayout.of(arch)
    g = Graph(name)
    x_rows = g.input("x", (1, rows * lay.rows, 1, lay.width))
    kv, masks, rope_in = declare_step_inputs(g, arch, layers, lay.cache_rows(a.kv_dim, cache),
                                             (cache, rows), 2 * rows)

    def block(i: int) -> Verify:
        b = Verify(g, arch, i, weights)
        b.attach(cache, rows, *kv[i], masks[arch.attention(i).window],
                 rope_input(rope_in, arch, i))
        return b

    return step_layers(g, arch, layers, unfold_rows(g, x_rows, a.dim, rows, "x_cols"),
                       block, lambda h: fold_rows(g, h, lay, "h_rows"))


def rows_head_graph(arch: Architecture, weights: Weights, name: str,
                    chunks: Sequence[tuple[int, int]], rows: int) -> Graph:
    """`head_graph` for K rows (a batch's slots, a verify's positions): x [1, K*R, 1, W]
    (K hidden states folded as decode folds one) -> per chunk the K rows' logits, a
    row after another, each folded to rows of 32 (ANE-C09): [1, K*padded/32, 1, 32]."""
    a = arch.args
    lay = RowLayout.of(arch)
    g = Graph(name)
    x = unfold_rows(g, g.input("x", (1, rows * lay.rows, 1, lay.width)), a.dim, rows, "x_cols")
    y = arch.final_norm(Prefill(g, arch, -1, weights), x)
    for n, (start, count) in enumerate(chunks):
        product = head_product(g, y, arch, weights, n, start, count)
        folded = product.shape[1] // 32
        cols = g.reshape(product, (1, folded, 32, rows), name=f"logits{n}_fold")
        logits = g.transpose(cols, (0, 3, 1, 2), name=f"logits{n}_t")   # [1, K, P/32, 32]
        g.output(f"logits{n}", g.reshape(logits, (1, rows * folded, 1, 32),
                                         name=f"logits{n}_rows"))
    return g
