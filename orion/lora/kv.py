"""The LoRA term in the KV-cache inference programs (`orion.models.llama_kv_programs`),
with the adapter's matrices packed into the programs' surface grid.

Those programs bind zero-copy surfaces of one uniform size in declared order
(ANE-C18, ANE-C20), every one a grid of rows of one width W: the decode row width,
or the prefill bucket S. So each adapted module's A [R, in] and B'^T = (s B)^T
[R, out] are folded into rows of W (a rank row takes ceil(n / W) surface rows, the
tail zero), and stacked into inputs `lora0`, `lora1`, ... of at most `capacity` rows,
the rows of the program's other inputs, so the uniform surface size does not grow.
The program slices them back out and adds y += B'(A x), as `orion.lora.graph` does.
k_proj and v_proj keep their n_kv_heads rows: these programs never expand k and v
per query head. Selecting another adapter of the same signature rewrites these
surfaces; it compiles nothing and reloads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orion.ir.graph import Graph, Value
from orion.lora.adapter import Adapter, module_shape
from orion.lora.config import LoraError
from orion.lora.graph import Signature, input_names, layer_feeds
from orion.models.llama_config import LlamaConfig


@dataclass(frozen=True)
class Slot:
    """Where one [rank, size] matrix lies: rows [row, row + rank * fold) of input
    `lora<chunk>`, each rank row folded into `fold` surface rows."""

    module: str
    which: str    # "a" (A) or "b" (B'^T)
    rank: int
    size: int
    chunk: int
    row: int
    fold: int

    @property
    def rows(self) -> int:
        return self.rank * self.fold


@dataclass(frozen=True)
class KvLora:
    """What a KV layer program is compiled for: the adapted modules and their program
    ranks, and the surface grid its LoRA inputs are folded into."""

    ranks: Signature
    width: int
    capacity: int

    def slots(self, cfg: LlamaConfig) -> list[Slot]:
        out: list[Slot] = []
        chunk = used = 0
        for module, rank in self.ranks:
            for which, size in zip("ab", module_shape(cfg, module)[::-1], strict=True):
                fold = -(-size // self.width)
                rows = rank * fold
                if rows > self.capacity:
                    raise LoraError(f"{module} at rank {rank} needs {rows} surface rows of "
                                    f"{self.width}; the program's surfaces hold "
                                    f"{self.capacity} (use a lower rank or larger buckets)")
                if used + rows > self.capacity:
                    chunk, used = chunk + 1, 0
                out.append(Slot(module, which, rank, size, chunk, used, fold))
                used += rows
        return out

    def chunk_rows(self, cfg: LlamaConfig) -> list[int]:
        rows: dict[int, int] = {}
        for s in self.slots(cfg):
            rows[s.chunk] = s.row + s.rows
        return [rows[c] for c in sorted(rows)]

    def declare(self, g: Graph, cfg: LlamaConfig) -> dict[str, tuple[Value, Value]]:
        """Declares the inputs (call right after the program's other inputs: the
        declared order is the binding order) and returns module -> (A [1, 1, R, in],
        B'^T [1, 1, R, out])."""
        chunks = [g.input(f"lora{c}", (1, rows, 1, self.width))
                  for c, rows in enumerate(self.chunk_rows(cfg))]
        mats: dict[tuple[str, str], Value] = {}
        for s in self.slots(cfg):
            name = f"lora_{s.which}_{s.module}"
            with g.scope(name):
                v = g.slice(chunks[s.chunk], (0, s.row, 0, 0), (1, s.rows, 1, self.width),
                            name="rows")
                v = g.reshape(v, (1, 1, s.rank, s.fold * self.width), name="unfold")
                if s.fold * self.width != s.size:
                    v = g.slice(v, (0, 0, 0, 0), (1, 1, s.rank, s.size), name="cut")
            mats[s.module, s.which] = v
        return {m: (mats[m, "a"], mats[m, "b"]) for m, _ in self.ranks}

    def pack(self, adapter: Adapter, layer: int, cfg: LlamaConfig) -> list[np.ndarray]:
        """One layer's inputs, fp16 [rows, width] per chunk."""
        feeds = layer_feeds(adapter, self.ranks, layer, cfg, expand_kv=False)
        out = [np.zeros((rows, self.width), np.float16) for rows in self.chunk_rows(cfg)]
        for s in self.slots(cfg):
            a_name, b_name = input_names(s.module)
            m = feeds[a_name][0, 0] if s.which == "a" else feeds[b_name][0, 0].T
            folded = np.zeros((s.rank, s.fold * self.width), np.float16)
            folded[:, : s.size] = m
            out[s.chunk][s.row: s.row + s.rows] = folded.reshape(s.rows, self.width)
        return out


def add_term(g: Graph, x: Value, y: Value, mats: tuple[Value, Value], name: str) -> Value:
    """y + B'(A x) for x [1, in, 1, S], y [1, out, 1, S]."""
    a, bt = mats
    s = x.shape[3]
    with g.scope(f"{name}_lora"):
        xs = g.reshape(x, (1, 1, x.shape[1], s), name="x")
        t = g.matmul(a, xs, name="ax")                          # [1, 1, R, S]
        u = g.matmul(bt, t, transpose_x=True, name="bax")      # [1, 1, out, S]
        return g.add(y, g.reshape(u, y.shape, name="term"), name="y")
