"""The LoRA term of an adapted linear layer, as graph ops, and its program inputs.

Forward:  y = W x + B' (A x)          backward:  dx = W^T dy + A^T (B'^T dy)

with A [R, in] and B' = s B [out, R] program INPUTS (`lora_a_<module>`,
`lora_b_<module>`, declared [1, 1, R, in] and [1, 1, out, R]), never baked consts:
selecting another adapter, changing its scale (folded into B') or training it is a
surface write, with no compile and no reload. The set of adapted modules and their
program rank R (`Signature`) is what the programs are compiled for; an adapter of lower
rank is zero-padded to R, which leaves B' A unchanged. Grouped-query k/v projections
run expanded to one row block per query head (`llama_programs.expand_kv`), so B' is
expanded the same way. With LoRA dropout the training programs take one more input
per module, the mask m (`lora_m_<module>`, [1, in, 1, S]): y = W x + B' A (m x), and
dx = W^T dy + m A^T B'^T dy.

`LoraSpec` is what the Llama graph builders are handed (`build_layer_graph(...,
lora=LoraSpec(signature))`, a `llama_programs.LinearHook`): it adds the term to the
linear layers it adapts and leaves the others alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orion.ir.graph import Graph, Value
from orion.lora.adapter import Adapter
from orion.models.llama_config import LlamaConfig

Signature = tuple[tuple[str, int], ...]   # ((module, program rank), ...) in MODULES order


def module_of(param_suffix: str) -> str:
    """"self_attn.q_proj.weight" -> "q_proj"."""
    return param_suffix.rsplit(".", 2)[-2]


def input_names(module: str) -> tuple[str, str]:
    return f"lora_a_{module}", f"lora_b_{module}"


def signature(adapter: Adapter | None) -> Signature:
    """The program signature an adapter needs (() for none: the base programs)."""
    if adapter is None:
        return ()
    return tuple((m, max(adapter.config.rank(i, m) for i in range(adapter.model.n_layers)))
                 for m in adapter.config.targets)


def mask_name(module: str) -> str:
    return f"lora_m_{module}"


@dataclass(frozen=True)
class LoraSpec:
    """What the layer programs are compiled for: the adapted modules and their program
    ranks (`Signature`), and whether the LoRA path has a dropout-mask input. The Llama
    graph builders call `apply` on every linear layer (`llama_programs.LinearHook`)."""

    ranks: Signature
    dropout: bool = False

    def apply(self, g: Graph, x: Value, y: Value, param_suffix: str, transpose: bool
              ) -> Value:
        module = module_of(param_suffix)
        rank = dict(self.ranks).get(module)
        if rank is None:
            return y
        return lora_term(g, x, y, module, rank, transpose, self.dropout)


def lora_term(g: Graph, x: Value, y: Value, module: str, rank: int, transpose: bool,
              dropout: bool = False) -> Value:
    """y + B'(A (m x)) (forward), or y + m A^T(B'^T x) with x = dy (backward); m is the
    dropout mask input `lora_m_<module>` ([1, in, 1, S]: 0 or 1/(1-p)) when `dropout`."""
    s = x.shape[3]
    a_name, b_name = input_names(module)
    out_ch, in_ch = (x.shape[1], y.shape[1]) if transpose else (y.shape[1], x.shape[1])
    a = _input(g, a_name, (1, 1, rank, in_ch))
    b = _input(g, b_name, (1, 1, out_ch, rank))
    m = _input(g, mask_name(module), (1, in_ch, 1, s)) if dropout else None
    if m is not None and not transpose:
        x = g.mul(x, m, name=f"{module}_dropped")
    xs = g.reshape(x, (1, 1, x.shape[1], s), name=f"{a_name}_x{int(transpose)}")
    if transpose:
        t = g.matmul(b, xs, transpose_x=True, name=f"{b_name}_t_dy")
        u = g.matmul(a, t, transpose_x=True, name=f"{a_name}_t_u")
    else:
        t = g.matmul(a, xs, name=f"{a_name}_x_mm")
        u = g.matmul(b, t, name=f"{b_name}_t_mm")
    term = g.reshape(u, y.shape, name=f"{b_name}_u{int(transpose)}")
    if m is not None and transpose:
        term = g.mul(term, m, name=f"{module}_dropped_dx")
    return g.add(y, term, name=f"{module}_lora_y{int(transpose)}")


def _input(g: Graph, name: str, shape: tuple[int, ...]) -> Value:
    for v in g.inputs:
        if v.name == name:
            return v
    return g.input(name, shape)


def layer_feeds(adapter: Adapter, sig: Signature, layer: int, cfg: LlamaConfig,
                expand_kv: bool = True) -> dict[str, np.ndarray]:
    """One layer's LoRA inputs in the declared shapes, fp16: A and s B, zero-padded to
    the signature's rank, B's k/v rows expanded for grouped-query attention when
    `expand_kv` (the training programs; the KV-cache programs keep the n_kv_heads)."""
    from orion.models import llama_programs

    out: dict[str, np.ndarray] = {}
    for module, rank in sig:
        a, b = adapter.matrices[layer, module]
        r = a.shape[0]
        sb = np.float32(adapter.config.scale(layer, module)) * b
        if expand_kv and module in ("k_proj", "v_proj"):
            sb = llama_programs.expand_kv(sb, cfg)
        ap = np.zeros((rank, a.shape[1]), np.float16)
        bp = np.zeros((sb.shape[0], rank), np.float16)
        ap[:r], bp[:, :r] = a, sb
        a_name, b_name = input_names(module)
        out[a_name] = ap.reshape(1, 1, *ap.shape)
        out[b_name] = bp.reshape(1, 1, *bp.shape)
    return out
