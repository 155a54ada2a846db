"""The device programs of a Llama training step, built with `orion.ir`.

Per layer four graphs, each one program (or a few, if the partitioner cuts it):

    attn_fwd   x -> h = x + Wo attn(rope(Wq xn), rope(Wk xn), Wv xn), xn = rms(x)
               outputs h and the taps backward needs: xn, q, k, v (after RoPE), attn
    ffn_fwd    h -> y = h + W2 (silu(W1 hn) * W3 hn), hn = rms(h); taps hn, gate, up, m
    ffn_bwd    dy, h, gate, up -> dh, and dgate, dup, dhn for the host's weight gradients
    attn_bwd   dh, x, q, k, v -> dx, and dq, dk, dv (before RoPE), dxn

Activations are channel-first [1, C, 1, S] (one sequence per evaluation). Weights
enter in one of two ways (`mode`):

    "delta"    baked consts (1x1 convs; backward bakes W^T), patched in place in the
               blob and reloaded after each optimizer step (ane-facts §4.2)
    "inputs"   [1, 1, O, I] program inputs multiplied with matmul (forward W x,
               backward W^T dy with transpose_x), so nothing is ever recompiled or
               reloaded (§4.3, the maderix dynamic pipeline)

Grouped-query attention runs as multi-head attention on the device: Wk and Wv are
expanded to one row block per query head (`expand_kv`) and their gradients summed back
over each group on the host (`reduce_kv`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from orion.ir import composites as C
from orion.ir import grads as G
from orion.ir.graph import Graph, Value
from orion.models.llama_config import LlamaConfig
from orion.models.llama_weights import layer_key

MODES = ("delta", "inputs")
KINDS = ("attn_fwd", "ffn_fwd", "ffn_bwd", "attn_bwd")


def expand_kv(w: np.ndarray, cfg: LlamaConfig) -> np.ndarray:
    """[kv_dim, D] -> [D, D]: each kv head's rows repeated for the query heads it serves."""
    groups = cfg.n_heads // cfg.n_kv_heads
    if groups == 1:
        return w
    return np.repeat(w.reshape(cfg.n_kv_heads, cfg.head_dim, -1), groups, axis=0) \
        .reshape(cfg.dim, -1)


def reduce_kv(dw: np.ndarray, cfg: LlamaConfig) -> np.ndarray:
    """The gradient of `expand_kv`: [D, D] summed back to [kv_dim, D]."""
    groups = cfg.n_heads // cfg.n_kv_heads
    if groups == 1:
        return dw
    return dw.reshape(cfg.n_kv_heads, groups, cfg.head_dim, -1).sum(axis=1) \
        .reshape(cfg.kv_dim, -1)


@dataclass(frozen=True)
class WeightSlot:
    """One weight a program holds: the IR name (a const in delta mode, an input in
    inputs mode), the parameter it comes from, and how: W, W^T, gamma."""

    name: str
    param: str
    transpose: bool = False
    vector: bool = False

    def matrix(self, weights: Mapping[str, np.ndarray], cfg: LlamaConfig) -> np.ndarray:
        """The slot's 2-D matrix (a transposed view for W^T slots); not for vectors."""
        w = np.asarray(weights[self.param])
        if self.param.endswith(("k_proj.weight", "v_proj.weight")):
            w = expand_kv(w, cfg)
        return w.T if self.transpose else w

    def declared_shape(self, matrix_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*matrix_shape, 1, 1) if self._conv else (1, 1, *matrix_shape)

    def value(self, weights: Mapping[str, np.ndarray], cfg: LlamaConfig) -> np.ndarray:
        """The slot's array in the shape the graph declares (in the dtype given)."""
        if self.vector:
            return np.asarray(weights[self.param]).reshape(1, -1, 1, 1)
        w = self.matrix(weights, cfg)
        return w.reshape(self.declared_shape(w.shape))

    _conv: bool = True


class LinearHook(Protocol):
    """Something added to a linear layer's output (LoRA, orion.lora.graph.LoraSpec)."""

    def apply(self, g: Graph, x: Value, y: Value, param_suffix: str, transpose: bool
              ) -> Value: ...


@dataclass
class LayerGraph:
    kind: str
    layer: int
    graph: Graph
    slots: list[WeightSlot] = field(default_factory=list)


class _Builder:
    def __init__(self, g: Graph, cfg: LlamaConfig, weights: Mapping[str, np.ndarray],
                 layer: int, mode: str, lora: LinearHook | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.g, self.cfg, self.w, self.layer, self.mode = g, cfg, weights, layer, mode
        self.lora = lora
        self.slots: list[WeightSlot] = []
        self._inputs: dict[str, Value] = {}

    def _slot(self, name: str, param_suffix: str, transpose: bool = False,
              vector: bool = False) -> tuple[WeightSlot, np.ndarray]:
        slot = WeightSlot(name, layer_key(self.layer, param_suffix), transpose, vector,
                          _conv=self.mode == "delta")
        self.slots.append(slot)
        return slot, slot.value(self.w, self.cfg)

    def linear(self, x: Value, name: str, param_suffix: str, transpose: bool = False
               ) -> Value:
        """W x (or W^T x) for x [1, I, 1, S], plus the LoRA term of an adapted module."""
        y = self._base_linear(x, name, param_suffix, transpose)
        if self.lora is not None:
            y = self.lora.apply(self.g, x, y, param_suffix, transpose)
        return y

    def _base_linear(self, x: Value, name: str, param_suffix: str, transpose: bool) -> Value:
        g, s = self.g, x.shape[3]
        if self.mode == "delta":
            _, arr = self._slot(name, param_suffix, transpose)
            return g.conv1x1(x, g.const(arr, name=name), name=f"{name}_y")
        # inputs: one [1, 1, O, I] input per matrix, shared by forward and backward
        if name not in self._inputs:
            _, arr = self._slot(name, param_suffix, False)
            self._inputs[name] = g.input(name, arr.shape)
        w = self._inputs[name]
        o = w.shape[3] if transpose else w.shape[2]
        xs = g.reshape(x, (1, 1, x.shape[1], s), name=f"{name}_x")
        y = g.matmul(w, xs, transpose_x=transpose, name=f"{name}_mm")
        return g.reshape(y, (1, o, 1, s), name=f"{name}_y")

    def gamma(self, name: str, param_suffix: str) -> Value:
        _, arr = self._slot(name, param_suffix, vector=True)
        if self.mode == "delta":
            return self.g.const(arr, name=name)
        return self.g.input(name, arr.shape)

    def rms_norm(self, x: Value, gamma: Value, name: str) -> Value:
        return C.rms_norm(self.g, x, gamma, self.cfg.norm_eps, name)

    def rms_norm_backward(self, x: Value, gamma: Value, dy: Value, name: str) -> Value:
        return G.rms_norm_backward(self.g, x, gamma, dy, self.cfg.norm_eps, name)


def _graph_name(kind: str, layer: int, tag: str) -> str:
    return f"l{layer:02d}_{kind}" + (f"_{tag}" if tag else "")


def build_layer_graph(kind: str, cfg: LlamaConfig, weights: Mapping[str, np.ndarray],
                      layer: int, seq: int, mode: str, tag: str = "",
                      lora: LinearHook | None = None) -> LayerGraph:
    """One of the four per-layer graphs (see the module docstring). `tag` goes into the
    graph name, hence into the weight keys and the program identifier: programs whose
    blobs are patched in place must not share an identifier (and so a folder) with a
    program of another model or process. `lora` adds a term to the linear layers it
    adapts (`orion.lora.graph.LoraSpec`: LoRA inputs and products)."""
    if not cfg.plain:
        raise ValueError("the training programs implement the plain Llama only (no "
                         "biases, q/k norms, explicit head_dim, RoPE scaling or window)")
    g = Graph(_graph_name(kind, layer, tag))
    b = _Builder(g, cfg, weights, layer, mode, lora)
    d, hidden, nh = cfg.dim, cfg.hidden_dim, cfg.n_heads
    act = lambda name, c=d: g.input(name, (1, c, 1, seq))  # noqa: E731
    if kind == "attn_fwd":
        x = act("x")
        xn = b.rms_norm(x, b.gamma("g_att", "input_layernorm.weight"), "att_norm")
        q = C.rope(g, b.linear(xn, "wq", "self_attn.q_proj.weight"), nh, cfg.rope_theta,
                   name="rope_q")
        k = C.rope(g, b.linear(xn, "wk", "self_attn.k_proj.weight"), nh, cfg.rope_theta,
                   name="rope_k")
        v = b.linear(xn, "wv", "self_attn.v_proj.weight")
        a = C.causal_attention(g, q, k, v, nh)
        h = g.add(x, b.linear(a, "wo", "self_attn.o_proj.weight"), name="h")
        for name, val in (("h", h), ("xn", xn), ("q", q), ("k", k), ("v", v), ("att", a)):
            g.output(name, val)
    elif kind == "ffn_fwd":
        h = act("h")
        hn = b.rms_norm(h, b.gamma("g_ffn", "post_attention_layernorm.weight"), "ffn_norm")
        gate = b.linear(hn, "w1", "mlp.gate_proj.weight")
        up = b.linear(hn, "w3", "mlp.up_proj.weight")
        m = g.mul(C.silu(g, gate), up, name="m")
        y = g.add(h, b.linear(m, "w2", "mlp.down_proj.weight"), name="y")
        for name, val in (("y", y), ("hn", hn), ("gate", gate), ("up", up), ("m", m)):
            g.output(name, val)
    elif kind == "ffn_bwd":
        dy, h, gate, up = act("dy"), act("h"), act("gate", hidden), act("up", hidden)
        dm = b.linear(dy, "w2t", "mlp.down_proj.weight", transpose=True)
        dgate = G.silu_backward(g, gate, g.mul(dm, up, name="dm_up"))
        dup = g.mul(dm, C.silu(g, gate, name="silu_gate"), name="dup")
        dhn = g.add(b.linear(dgate, "w1t", "mlp.gate_proj.weight", transpose=True),
                    b.linear(dup, "w3t", "mlp.up_proj.weight", transpose=True), name="dhn")
        dh = g.add(dy, b.rms_norm_backward(
            h, b.gamma("g_ffn", "post_attention_layernorm.weight"), dhn, "ffn_norm_bwd"),
            name="dh")
        for name, val in (("dh", dh), ("dgate", dgate), ("dup", dup), ("dhn", dhn)):
            g.output(name, val)
    elif kind == "attn_bwd":
        dh, x, q, k, v = act("dh"), act("x"), act("q"), act("k"), act("v")
        da = b.linear(dh, "wot", "self_attn.o_proj.weight", transpose=True)
        dq, dk, dv = G.causal_attention_backward(g, q, k, v, da, nh)
        dqp = G.rope_backward(g, dq, nh, cfg.rope_theta, name="rope_dq")
        dkp = G.rope_backward(g, dk, nh, cfg.rope_theta, name="rope_dk")
        dxn = g.add(g.add(b.linear(dqp, "wqt", "self_attn.q_proj.weight", transpose=True),
                          b.linear(dkp, "wkt", "self_attn.k_proj.weight", transpose=True),
                          name="dxn_qk"),
                    b.linear(dv, "wvt", "self_attn.v_proj.weight", transpose=True), name="dxn")
        dx = g.add(dh, b.rms_norm_backward(
            x, b.gamma("g_att", "input_layernorm.weight"), dxn, "att_norm_bwd"), name="dx")
        for name, val in (("dx", dx), ("dq", dqp), ("dk", dkp), ("dv", dv), ("dxn", dxn)):
            g.output(name, val)
    else:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    return LayerGraph(kind, layer, g, b.slots)


def build_all(cfg: LlamaConfig, weights: Mapping[str, np.ndarray], seq: int, mode: str
              ) -> list[LayerGraph]:
    return [build_layer_graph(kind, cfg, weights, i, seq, mode)
            for i in range(cfg.n_layers) for kind in KINDS]


SlotValues = Callable[[WeightSlot], np.ndarray]
