"""The programs of batched decode: one eval advances B sequences by a token each, in
the columns a decode step pays for anyway (the ANE pads a surface to 32 columns,
ANE-C24; on vane a conv over B columns reads each weight once for all of them).

batch layers, cache T, B rows   x [1, B*R, 1, W] (row b's hidden state folded as
                                decode folds its one row, `RowLayout`), then of each
                                layer k_cache, v_cache [1, B*T*KVD/W, 1, W] (slot b's
                                head-major [KV, T, hd] cache after slot b-1's), then a
                                mask [1, B*T, 1, 1] per attention window (slot b's T
                                positions after slot b-1's) and, for rotary layers, a
                                rope [1, 2B, 1, hd] per RoPE (the B cos rows, then the
                                B signed sin rows)
                                -> h [1, B*R, 1, W] (folded rows, as x), then k_new,
                                v_new [1, B, 1, KVD] of each layer (row b: slot b's new
                                key, head-major). Every output is whole rows of the
                                surface width, so nothing is padded column by column.
    row b is the decode step of slot b: its own position, cache, mask and RoPE row. Its
    attention is `Decode`'s with the slot as the leading axis, so no row reads another's
    keys: a row's values do not depend on what the other rows hold.
prompts, G groups of K rows     x [1, N*R, 1, W] (N = G*K columns, folded as batch's x),
                                then for rotary layers a rope [1, 2N, 1, hd] per RoPE
                                -> h [1, N*R, 1, W], then k_new, v_new [1, N, 1, KVD] of
                                each layer (row n: column n's key and value, head-major)
    group g is rows [g*K, (g+1)*K): one prompt from position 0, its rows causal among
    themselves and nothing else (its slot's cache is empty). Its attention is
    `Verify`'s over its own rows, with the group as the leading axis, so a prompt's
    values do not depend on which group it takes or on what the others hold.
batch head, B rows              h as the layers leave it -> logits per vocabulary chunk
                                of the plan's head part (at most 32768 rows, ANE-C08):
                                slot b's logits a row, folded into rows of 32
                                (`orion.models.programs.rows_head_graph`, shared with
                                speculative verification)

The layers a program runs are the plan's groups (`orion.models.plan`), as for decode.
"""

from __future__ import annotations

from collections.abc import Sequence

from orion.ir.graph import Graph, Value
from orion.models import rope as R
from orion.models.adapters import BatchLora
from orion.models.architecture import Architecture
from orion.models.blocks import (
    Block,
    Decode,
    RowLayout,
    Weights,
    fold_rows,
    position_rows,
    unfold_rows,
    window_mask,
)
from orion.models.programs import declare_step_inputs, group_ropes, rope_input, step_layers


class BatchDecode(Decode):
    """B decode steps of B sequences (the module docstring): `Decode`'s attention with
    the slot as the leading axis."""

    rows: int

    def attention(self, q: Value, k: Value, v: Value) -> Value:
        g, a = self.g, self.args
        nh, nkv, hd, b = a.n_heads, a.n_kv_heads, a.head_dim, self.rows

        def per_row(x: Value, heads: int, name: str) -> Value:
            """[1, heads*hd, 1, B] -> [B, heads, 1, hd]."""
            t = g.reshape(x, (1, heads, hd, b), name=f"{name}_heads")
            return g.transpose(t, (3, 1, 0, 2), name=f"{name}_rows")

        def per_column(x: Value, name: str) -> Value:
            """[B, heads, 1, hd] -> [1, heads*hd, 1, B] (per_row's inverse)."""
            t = g.transpose(x, (2, 1, 3, 0), name=f"{name}_t")             # [1, h, hd, B]
            return g.reshape(t, (1, x.shape[1] * hd, 1, b), name=f"{name}_cols")

        cos = sin = None
        if self.rope_in is not None:
            cos = g.reshape(g.slice(self.rope_in, (0, 0, 0, 0), (1, b, 1, hd), name="cos_in"),
                            (b, 1, 1, hd), name="cos")
            sin = g.reshape(g.slice(self.rope_in, (0, b, 0, 0), (1, b, 1, hd), name="sin_in"),
                            (b, 1, 1, hd), name="sin")
        with g.composite("attention", "attn"):
            o, kn, vn = self._attend(per_row(q, nh, "q"), per_row(k, nkv, "k"),
                                     per_row(v, nkv, "v"), cos, sin, b)
            attn = per_column(g.reshape(o, (b, nh, 1, hd), name="o_rows"), "o")
        self.k_new = g.reshape(kn, (1, b, 1, a.kv_dim), name="k_rows")
        self.v_new = g.reshape(vn, (1, b, 1, a.kv_dim), name="v_rows")
        return attn

    def _lora_term(self, x: Value, y: Value, pieces: Sequence[tuple[Value, Value]],
                   module: str, name: str) -> Value:
        """y + B'_b (A_b x_b) for each row b with its own adapter's matrices
        (`orion.models.adapters.BatchLora`): `Decode`'s term with the row as the
        leading axis, so a row computes what its decode step alone computes."""
        g, b = self.g, self.rows
        with g.scope(f"{name}_lora"):
            xs = g.transpose(g.reshape(x, (1, 1, x.shape[1], b), name="x"), (3, 1, 2, 0),
                             name="x_rows")                                # [B, 1, in, 1]
            u: Value | None = None
            for n, (a, bt) in enumerate(pieces):
                part = f"{n}" if n else ""
                t = g.matmul(a, xs, name=f"ax{part}")                       # [B, 1, r, 1]
                un = g.matmul(bt, t, transpose_x=True, name=f"bax{part}")  # [B, 1, out, 1]
                u = un if u is None else g.add(u, un, name=f"bax_sum{part}")
            assert u is not None
            cols = g.transpose(u, (3, 1, 2, 0), name="term_t")           # [1, 1, out, B]
            out = g.add(y, g.reshape(cols, y.shape, name="term"), name="y")
        return out


def batch_graph(arch: Architecture, weights: Weights, layers: range, name: str, cache: int,
                rows: int, lora_in: BatchLora | None = None) -> Graph:
    """`lora_in`: each row's LoRA inputs, declared after the other inputs."""
    a = arch.args
    lay = RowLayout.of(arch)
    g = Graph(name)
    x_rows = g.input("x", (1, rows * lay.rows, 1, lay.width))
    kv, masks, rope_in = declare_step_inputs(
        g, arch, layers, rows * lay.cache_rows(a.kv_dim, cache), (rows * cache, 1), 2 * rows)
    several = len(layers) > 1
    loras = {i: lora_in.declare(g, arch, f"l{i}_" if several else "") if lora_in else {}
             for i in layers}

    def block(i: int) -> BatchDecode:
        b = BatchDecode(g, arch, i, weights, loras[i])
        b.rows = rows
        b.attach(cache, *kv[i], masks[arch.attention(i).window], rope_input(rope_in, arch, i))
        return b

    return step_layers(g, arch, layers, unfold_rows(g, x_rows, a.dim, rows, "x_cols"),
                       block, lambda h: fold_rows(g, h, lay, "h_rows"))


class PromptGroups(Block):
    """G prompts of K rows each from position 0 (the module docstring): `Verify`'s
    attention among a group's own rows, with the group as the leading axis."""

    k_new: Value
    v_new: Value

    def attach(self, group: int, columns: int, rope: Value | None) -> None:
        self.group, self.columns, self.rope_in = group, columns, rope

    def attention(self, q: Value, k: Value, v: Value) -> Value:
        g, a, spec = self.g, self.args, self.spec
        assert spec is not None
        nh, nkv, hd = a.n_heads, a.n_kv_heads, a.head_dim
        n, rows = self.columns, self.group
        lead, per_kv = n // rows, nh // nkv

        def grouped(x: Value, heads: int, what: str) -> Value:
            """[1, heads*hd, 1, G*K] -> [G, heads, K, hd]"""
            t = g.reshape(x, (heads, hd, lead, rows), name=f"{what}_heads")
            return g.transpose(t, (2, 0, 3, 1), name=f"{what}_groups")

        with g.composite("attention", "attn"):
            qh, kn, vn = grouped(q, nh, "q"), grouped(k, nkv, "k"), grouped(v, nkv, "v")
            if self.rope_in is not None:
                cos = g.reshape(g.slice(self.rope_in, (0, 0, 0, 0), (1, n, 1, hd),
                                        name="cos_rows"), (lead, 1, rows, hd), name="cos")
                sin = g.reshape(g.slice(self.rope_in, (0, n, 0, 0), (1, n, 1, hd),
                                        name="sin_rows"), (lead, 1, rows, hd), name="sin")
                qh = R.apply(g, qh, cos, sin, 3, "rope_q")
                kn = R.apply(g, kn, cos, sin, 3, "rope_k")
            qg = g.reshape(qh, (lead, nkv, per_kv * rows, hd), name="q_kv")  # [G, KV, Gq*K, hd]
            scores = g.reshape(g.matmul(qg, kn, transpose_y=True, name="scores"),
                               (lead, nh, rows, rows), name="scores_h")
            causal = g.const(window_mask(rows, spec.window), name="causal")  # [1, 1, K, K]
            p = g.softmax(g.mul(g.add(scores, causal, name="masked"), spec.scale,
                                name="scaled"), axis=-1, name="probs")
            p = g.reshape(p, (lead, nkv, per_kv * rows, rows), name="p_kv")
            o = g.reshape(g.matmul(p, vn, name="o"), (lead, nh, rows, hd), name="o_heads")
            o = g.transpose(o, (1, 3, 0, 2), name="o_t")                  # [H, hd, G, K]
            attn = g.reshape(o, (1, a.q_dim, 1, n), name="o_cols")
        self.k_new = position_rows(g, kn, a.kv_dim, "k")
        self.v_new = position_rows(g, vn, a.kv_dim, "v")
        return attn


def prompts_graph(arch: Architecture, weights: Weights, layers: range, name: str, group: int,
                  columns: int) -> Graph:
    """The layers of `columns // group` prompts of `group` rows each (module docstring)."""
    a = arch.args
    lay = RowLayout.of(arch)
    g = Graph(name)
    x_rows = g.input("x", (1, columns * lay.rows, 1, lay.width))
    ropes = group_ropes(arch, layers)
    rope_in = {r: g.input("rope" if len(ropes) == 1 else f"rope{n}",
                          (1, 2 * columns, 1, a.head_dim)) for n, r in enumerate(ropes)}

    def block(i: int) -> PromptGroups:
        b = PromptGroups(g, arch, i, weights)
        b.attach(group, columns, rope_input(rope_in, arch, i))
        return b

    return step_layers(g, arch, layers, unfold_rows(g, x_rows, a.dim, columns, "x_cols"),
                       block, lambda h: fold_rows(g, h, lay, "h_rows"))
