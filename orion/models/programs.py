"""The inference programs of every architecture, built from its blocks:

prefill layer i, bucket S   x [1, D, 1, S] -> h [1, D, 1, S], k, v [1, KVD, 1, S]
    the prompt as one sequence from position 0 (padded to S, causal). k is after RoPE
    (and a q/k norm): what the cache keeps.
decode layer i, cache T      x [1, R, 1, W] (the D channels folded into rows of the
                             surface width W = lcm(KVD, 32), zero-padded), k_cache,
                             v_cache [1, T*KVD/W, 1, W], mask [1, T, 1, 1], and for a
                             rotary layer rope [1, 2, 1, hd] (cos, signed sin of the
                             position) -> h [1, R, 1, W], k_new, v_new [1, 1, 1, KVD]
    one token against the cache. The cache is head-major, [KV, T, hd] from the first
    byte of its surface (`orion.models.kv_cache`), and holds the n_kv_heads heads only:
    the program reads it as [1, KV, T, hd] by a reshape, so both attention products
    read each head's keys and values contiguously, and the query heads of a group
    attend to their shared key head as a [G, hd] block of one matmul, never an
    expanded copy. The new key and value join inside the program (one softmax over
    T + 1 scores) and are written into position `pos` by the host. The surfaces serve
    every bucket; the host lays the cache out again when a step moves to another.
head                         x [1, R, 1, W] -> logits in vocabulary chunks
    the final norm and the classifier, chunked to at most 32768 output channels per
    conv (ANE-C08) and each chunk folded to rows of 32 (ANE-C09).

LoRA: a layer program compiled for an adapter signature (`ProgramKey.lora`) takes the
adapter's A and B' as further inputs `lora0`, `lora1`, ... after the ones above,
folded into the same surface grid (`orion.models.adapters.KvLora`).

Every program is lowered by the one pipeline (`orion.ir.compile.lower_graph`: whole-
graph passes, the partitioner, program passes, MIL) and must come out as one program.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orion.errors import PlanError
from orion.ir.graph import Graph
from orion.ir.mil import EmittedProgram
from orion.ir.partition import DeviceLimits
from orion.models.adapters import Signature
from orion.models.architecture import Architecture
from orion.models.blocks import (
    Decode,
    Lora,
    Prefill,
    RowLayout,
    Weights,
    fold_row,
    unfold_row,
)

HEAD_CHUNK = 32768
HEAD_FILL_ROWS = 4096   # classifier rows converted at a time (16 MiB at dim 1024)
# One inference program per (kind, layer, bucket): as large as the device loads (a blob
# under 4 GiB, ANE-C36), never cut (a cut layer would need host copies between its
# parts on every token; the program planner of issue 30 decides such cuts).
INFERENCE_LIMITS = DeviceLimits(max_weight_bytes=(4 << 30) - 1, max_ops=1 << 20)


@dataclass(frozen=True)
class ProgramKey:
    kind: str    # "prefill", "decode", "head"
    layer: int   # -1 for the head
    size: int    # S for prefill, T for decode, 1 for the head
    lora: Signature = ()   # the LoRA adapter's modules and ranks

    def name(self, model_type: str, tag: str) -> str:
        where = "head" if self.layer < 0 else f"l{self.layer:02d}"
        sig = "".join(f"_{m.replace('.', '_')}{r}" for m, r in self.lora)
        return f"{model_type}_{tag}_{where}_{self.kind}{self.size}{sig}"


def prefill_graph(arch: Architecture, weights: Weights, layer: int, name: str, seq: int,
                  lora_in: object | None = None) -> Graph:
    """`lora_in` is an `orion.models.adapters.KvLora` (its inputs are declared after x)."""
    g = Graph(name)
    x = g.input("x", (1, arch.args.dim, 1, seq))
    b = Prefill(g, arch, layer, weights, _declare(lora_in, g, arch))
    g.output("h", arch.layer(b, x))
    g.output("k", b.cache_k)
    g.output("v", b.cache_v)
    return g


def decode_graph(arch: Architecture, weights: Weights, layer: int, name: str, cache: int,
                 lora_in: object | None = None) -> Graph:
    g = Graph(name)
    b = Decode(g, arch, layer, weights)
    x_rows = b.declare_inputs(cache)
    b.lora = _declare(lora_in, g, arch)
    x = unfold_row(g, x_rows, arch.args.dim, "x_col")
    h = arch.layer(b, x)
    g.output("h", fold_row(g, h, RowLayout.of(arch), "h_rows"))
    g.output("k_new", b.k_new)
    g.output("v_new", b.v_new)
    return g


def _declare(lora_in: object | None, g: Graph, arch: Architecture) -> Lora:
    if lora_in is None:
        return {}
    return lora_in.declare(g, arch)  # type: ignore[attr-defined]


def head_chunks(vocab: int) -> list[tuple[int, int]]:
    """(first row, rows) of each classifier chunk."""
    return [(s, min(HEAD_CHUNK, vocab - s)) for s in range(0, vocab, HEAD_CHUNK)]


def head_graph(arch: Architecture, weights: Weights, name: str) -> Graph:
    """The final norm and the classifier of one row; the classifier is read in fp16 a
    chunk at a time (a 151,936-row table is never converted whole)."""
    a = arch.args
    lay = RowLayout.of(arch)
    g = Graph(name)
    x = unfold_row(g, g.input("x", (1, lay.rows, 1, lay.width)), a.dim, "x_col")
    y = arch.final_norm(Prefill(g, arch, -1, weights), x)
    source = weights.source
    quant = getattr(source, "quant", None)
    compressed = quant(arch.classifier_name) if quant is not None else None
    for n, (start, rows) in enumerate(head_chunks(a.vocab_size)):
        padded = -(-rows // 32) * 32
        if compressed is not None:   # the chunk's rows, compressed as the source holds them
            w = g.const(compressed.rows(start, start + rows, padded).with_shape(
                (padded, a.dim, 1, 1)), name=f"w_head{n}")
        else:
            part = np.zeros((padded, a.dim), np.float16)   # the baked type; half of fp32
            for lo in range(0, rows, HEAD_FILL_ROWS):       # bounded temporaries
                hi = min(rows, lo + HEAD_FILL_ROWS)
                part[lo:hi] = source.fp16(arch.classifier_name,  # type: ignore[union-attr]
                                          slice(start + lo, start + hi))
            part.setflags(write=False)
            w = g.const(part.reshape(padded, a.dim, 1, 1), name=f"w_head{n}")
        logits = g.conv1x1(y, w, name=f"logits{n}")
        g.output(f"logits{n}", g.reshape(logits, (1, padded // 32, 1, 32),
                                         name=f"logits{n}_rows"))
    return g


def lower(g: Graph) -> EmittedProgram:
    """One graph as one legal program (see the module docstring)."""
    from orion.ir.compile import lower_graph

    lowered = lower_graph(g, INFERENCE_LIMITS, share_weights=True)
    if len(lowered.emitted) != 1 or len(lowered.plan.stages) != 1:
        raise PlanError(f"{g.name} lowers to {len(lowered.plan.stages)} stages; an "
                           "inference program must be one")
    return lowered.emitted[0]
