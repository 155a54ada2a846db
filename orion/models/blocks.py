"""The graph blocks architectures are written in, for every path a layer runs on.

An architecture's `layer(b, x)` calls these on a `Block`; the block's mode decides what
each becomes:

    Prefill   the prompt as one sequence x [1, D, 1, S] from position 0: attention is
              causal (windowed where the layer says) with RoPE tables baked, and the
              keys and values are outputs for the KV cache
    Decode    one token against the cache: inputs x (folded rows), k_cache, v_cache,
              mask (and rope) in that order; outputs h, k_new, v_new
    Train     Prefill's math without cache outputs; every weight use is recorded
              (`uses`) so the backward program can tap what the host needs for the
              weight gradients, and weights are consts (patched by delta updates) or
              program inputs

Linear layers take the LoRA term of an adapted module (`lora`: A [1, 1, R, in] and
B'^T = (s B)^T [1, 1, R, out] as graph values, a dropout mask optional). Norms carry
their own backward (`Graph.custom_vjp`): the fp16-safe forms of `orion.ir.grads`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from orion.ir import composites as C
from orion.ir import grads as G
from orion.ir.graph import Graph, Value
from orion.ir.legalize import ROW_ALIGN
from orion.ir.quant import QuantTensor
from orion.models import rope as R
from orion.models.architecture import Architecture, AttentionSpec
from orion.models.weights import WeightSource

MASK_VALUE = C.MASK_VALUE
# module -> its rank pieces (A [1, 1, r, in], B'^T [1, 1, r, out]): one, unless an
# inference program's inputs hold the matrices only in parts (`adapters.KvLora`)
Lora = Mapping[str, Sequence[tuple[Value, Value]]]


@dataclass(frozen=True)
class Use:
    """One use of a parameter, for its gradient on the host:
    "linear"  y = W x (+ ...):     dW = dy x^T, summed over positions
    "scale"   y = x * gamma:       dgamma = sum(dy * x) over all but the channels
    "shift"   y = x + beta:        dbeta = sum(dy) over all but the channels
    "lora"    y += B'(A x):        dA, dB from x and dy (`param` names the module)"""

    param: str
    kind: str
    x: Value | None
    y: Value


@dataclass
class Slot:
    """A weight as the graph holds it: its const or input name, the parameter it comes
    from, the shape the graph declares, and the form (`transform`: "" as is,
    "transpose" for W^T, "plus_one" for a (1 + w) gain)."""

    name: str
    param: str
    shape: tuple[int, ...]
    transform: str = ""


@dataclass
class Weights:
    """Where a block reads its weights: `source` (by parameter name); `as_inputs` makes
    every weight a program input (training's "inputs" strategy) instead of a const."""

    source: WeightSource
    as_inputs: bool = False
    slots: list[Slot] = field(default_factory=list)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.source.shape(name))

    def matrix(self, name: str) -> np.ndarray | QuantTensor:
        """fp16, or the compressed form a quantized source holds (`quant`)."""
        q = self.source.quant(name)
        return q if q is not None else self.source.fp16(name)

    def vector(self, name: str) -> np.ndarray:
        return self.source.fp32(name)


class Block:
    """Builds one layer's graph (see the module docstring); subclasses are the modes."""

    def __init__(self, g: Graph, arch: Architecture, layer: int, weights: Weights,
                 lora: Lora | None = None, dropout: Mapping[str, Value] | None = None
                 ) -> None:
        self.g, self.arch, self.args, self.layer = g, arch, arch.args, layer
        self.weights = weights
        self.lora = lora or {}
        self.dropout = dropout or {}
        self.prefix = arch.layer_prefix(layer) if layer >= 0 else ""
        self.spec: AttentionSpec | None = arch.attention(layer) if layer >= 0 else None
        self.uses: list[Use] = []

    # ---- weights -------------------------------------------------------------------

    def param(self, suffix: str) -> str:
        """A layer tensor's full name ("mlp.up_proj.weight" -> "model.layers.3.mlp...")."""
        return self.prefix + suffix

    def const_name(self, param: str) -> str:
        """The graph name of a parameter: its name within the layer, so every layer's
        graph names it alike ("model.layers.3.mlp.up_proj.weight" -> "mlp_up_proj_weight";
        one program can then serve every layer when weights are inputs)."""
        local = param[len(self.prefix):] if param.startswith(self.prefix) else param
        return local.replace(".", "_")

    def _product(self, x: Value, param: str) -> Value:
        """W x as a 1x1 conv over the [O, I] weight as a const [O, I, 1, 1] (fp16,
        frozen); a palettized weight's per-channel scale multiplies the product after
        the conv (ANE-C57), as coremltools places it for the ANE."""
        w = self.weights.matrix(param)
        if isinstance(w, QuantTensor):   # a frozen compressed base: never patched or staged
            const = self.g.const(w.unscaled().with_shape((*w.shape[:2], 1, 1)),
                                 name=self.const_name(param))
            y = self.g.conv1x1(x, const)
            if w.post_scale is None:
                return y
            scale = C.channel_vector(self.g, w.post_scale, self.const_name(param) + "_scale")
            return self.g.mul(y, scale, name="post_scale")
        w.setflags(write=False)   # frozen: the graph takes it without a copy
        w = w.reshape(*w.shape[:2], 1, 1)
        v = self.g.const(w, name=self.const_name(param))
        self.weights.slots.append(Slot(v.name, param, w.shape))
        return self.g.conv1x1(x, v)

    def _vector(self, param: str, plus_one: bool = False) -> Value:
        """A per-channel vector as [1, C, 1, 1]: a const, or an input (as_inputs)."""
        name = self.const_name(param)
        shape = (1, self.weights.shape(param)[0], 1, 1)
        if self.weights.as_inputs:
            out = self.g.input(name, shape)
        else:
            v = self.weights.vector(param)
            out = C.channel_vector(self.g, (1.0 + v) if plus_one else v, name)
        self.weights.slots.append(Slot(out.name, param, shape, "plus_one" if plus_one else ""))
        return out

    # ---- blocks --------------------------------------------------------------------

    def linear(self, x: Value, module: str, bias: bool = False) -> Value:
        """W x (+ b) for x [1, I, 1, S] as a 1x1 conv (ANE-C43), plus the LoRA term of
        an adapted module. `module` is the path within the layer ("self_attn.q_proj")."""
        g = self.g
        param = self.param(f"{module}.weight")
        name = module.replace(".", "_")
        with g.scope(name):
            if self.weights.as_inputs:
                if self.weights.source.quant(param) is not None:
                    from orion.errors import PlanError

                    raise PlanError(f"{param} is a compressed frozen weight: it must be baked "
                                    "into the programs, not fed as an input")
                y = self._matmul_linear(x, param)
            else:
                y = self._product(x, param)
            self.uses.append(Use(param, "linear", x, y))
            if bias:
                b = self._vector(self.param(f"{module}.bias"))
                y = g.add(y, b)
                self.uses.append(Use(self.param(f"{module}.bias"), "shift", None, y))
        mats = self.lora.get(module)
        if mats is not None:
            y = self._lora_term(x, y, mats, module, name)
        return y

    def _matmul_linear(self, x: Value, param: str) -> Value:
        """W x with W a program input [1, 1, O, I] (weights as inputs, ane-facts §4.3)."""
        g = self.g
        name = self.const_name(param)
        shape = self.weights.shape(param)
        self.weights.slots.append(Slot(name, param, (1, 1, *shape)))
        w = g.input(name, (1, 1, *shape))
        s = x.shape[3]
        y = g.matmul(w, g.reshape(x, (1, 1, x.shape[1], s), name="xs"), name="mm")
        return g.reshape(y, (1, shape[0], 1, s), name="y")

    def _lora_term(self, x: Value, y: Value, pieces: Sequence[tuple[Value, Value]],
                   module: str, name: str) -> Value:
        """y + B'(A (m x)), m the module's dropout mask when training has one; B'A is
        the sum over the rank pieces."""
        g = self.g
        s = x.shape[3]
        with g.scope(f"{name}_lora"):
            mask = self.dropout.get(module)
            xin = g.mul(x, mask, name="dropped") if mask is not None else x
            xs = g.reshape(xin, (1, 1, x.shape[1], s), name="x")
            u: Value | None = None
            for n, (a, bt) in enumerate(pieces):
                part = f"{n}" if n else ""
                t = g.matmul(a, xs, name=f"ax{part}")                         # [1, 1, r, S]
                un = g.matmul(bt, t, transpose_x=True, name=f"bax{part}")    # [1, 1, out, S]
                u = un if u is None else g.add(u, un, name=f"bax_sum{part}")
            assert u is not None
            out = g.add(y, g.reshape(u, y.shape, name="term"), name="y")
        self.uses.append(Use(module, "lora", xin, out))
        return out

    def rms_norm(self, x: Value, weight: str, eps: float | None = None,
                 plus_one: bool = False, name: str | None = None) -> Value:
        """RMSNorm over channels, x * (mean(x^2) + eps)^-0.5 * gamma, fp16-safe
        (`composites.normalize`); `plus_one`: Gemma's (1 + w) gain."""
        g = self.g
        eps = self.args.norm_eps if eps is None else eps
        param = self.param(weight)
        gamma = self._vector(param, plus_one)
        with g.composite("rms_norm", name or weight.split(".")[0]):
            xhat, _, _ = C.normalize(g, x, eps)
            y = g.mul(xhat, C.gain(g, gamma, "gamma"), name="y")
        g.custom_vjp(y, (x, gamma), lambda gb, ins, dy: [
            G.rms_norm_backward(gb, ins[0], ins[1], dy, eps), None])
        self.uses.append(Use(param, "scale", xhat, y))
        return y

    def layer_norm(self, x: Value, weight: str, bias: str, eps: float | None = None,
                   name: str | None = None) -> Value:
        """LayerNorm over channels with gain and bias, fp16-safe."""
        g = self.g
        eps = self.args.norm_eps if eps is None else eps
        gamma = self._vector(self.param(weight))
        beta = self._vector(self.param(bias))
        with g.composite("layer_norm", name or weight.split(".")[0]):
            mean = g.reduce_mean(x, 1, name="mean")
            xhat, _, _ = C.normalize(g, g.sub(x, mean, name="xc"), eps)
            scaled = g.mul(xhat, C.gain(g, gamma, "gamma"), name="scaled")
            y = g.add(scaled, C.gain(g, beta, "beta"), name="y")
        g.custom_vjp(y, (x, gamma, beta), lambda gb, ins, dy: [
            G.layer_norm_backward(gb, ins[0], ins[1], dy, eps), None, None])
        self.uses.append(Use(self.param(weight), "scale", xhat, y))   # d scaled = d y
        self.uses.append(Use(self.param(bias), "shift", None, y))
        return y

    def head_norm(self, x: Value, n_heads: int, weight: str, plus_one: bool = False,
                  eps: float | None = None) -> Value:
        """RMSNorm of each head of x [1, n*hd, 1, S] over its hd channels (Qwen3's and
        Gemma 3's q/k norms)."""
        g = self.g
        s, hd = x.shape[3], x.shape[1] // n_heads
        with g.scope(weight.split(".")[-2]):
            t = g.transpose(g.reshape(x, (1, n_heads, hd, s), name="heads"), (0, 2, 1, 3),
                            name="t")                                 # [1, hd, n, S]
            y = self.rms_norm(t, weight, eps, plus_one, name="rms")
            y = g.transpose(y, (0, 2, 1, 3), name="back")
            return g.reshape(y, (1, n_heads * hd, 1, s), name="y")

    def attention(self, q: Value, k: Value, v: Value) -> Value:
        """Attention of q [1, q_dim, 1, S] over k, v [1, kv_dim, 1, S] as this layer's
        `AttentionSpec` says; the mode decides against what (see the subclasses)."""
        raise NotImplementedError

    # ---- activations -----------------------------------------------------------------

    def silu(self, x: Value) -> Value:
        return C.silu(self.g, x)

    def gelu_tanh(self, x: Value, name: str = "gelu") -> Value:
        return C.gelu_tanh(self.g, x, name=name)

    def add(self, x: Value, y: Value, name: str) -> Value:
        return self.g.add(x, y, name=name)


def gated_mlp(b: Block, x: Value, act: Callable[[Value], Value], gate_up: str = "",
              ) -> Value:
    """down(act(gate(x)) * up(x)): SwiGLU (Llama) and GeGLU (Gemma). `gate_up` names a
    fused [2H, D] projection (Phi-3) split into gate then up."""
    g = b.g
    if gate_up:
        h = b.args.hidden_dim
        gate, up = g.split(b.linear(x, gate_up), (h, h), axis=1, name="gate_up_split")
    else:
        gate = b.linear(x, "mlp.gate_proj")
        up = b.linear(x, "mlp.up_proj")
    m = g.mul(act(gate), up, name="m")
    return b.linear(m, "mlp.down_proj")


def split_qkv(b: Block, qkv: Value) -> tuple[Value, Value, Value]:
    """q, k, v from one fused projection (one long GEMV streams its weights faster than
    three short ones), split on channels."""
    a = b.args
    q, k, v = b.g.split(qkv, (a.q_dim, a.kv_dim, a.kv_dim), axis=1, name="qkv_split")
    return q, k, v


# ---- the modes --------------------------------------------------------------------


def window_mask(seq: int, window: int) -> np.ndarray:
    """[1, 1, S, S]: 0 where the key is visible to the query (key <= query, and within
    `window` positions when it is not 0), MASK_VALUE elsewhere."""
    m = C.causal_mask(seq)
    if window:
        far = np.tril(np.ones((seq, seq), bool), k=-window)
        m = m.copy()
        m[0, 0][far] = MASK_VALUE
    return m


class Prefill(Block):
    """The prompt as one sequence (module docstring). `cache_k`, `cache_v` are the
    values the KV cache keeps: k after RoPE (and its norm), v as projected."""

    cache_k: Value
    cache_v: Value

    def attention(self, q: Value, k: Value, v: Value) -> Value:
        g, a, spec = self.g, self.args, self.spec
        assert spec is not None
        nh, nkv, hd = a.n_heads, a.n_kv_heads, a.head_dim
        groups = nh // nkv
        seq = q.shape[3]
        cos_c = sin_c = None
        if spec.rope is not None:
            cos_t, sin_t = spec.rope.signed(np.arange(seq))              # [S, hd]
            cos_c = g.const(cos_t.T.astype(np.float32).reshape(1, 1, hd, seq),
                            name="rope_cos")
            sin_c = g.const(sin_t.T.astype(np.float32).reshape(1, 1, hd, seq),
                            name="rope_sin")
        with g.composite("attention", "attn"):
            qh = g.reshape(q, (1, nh, hd, seq), name="q_heads")
            kh = g.reshape(k, (1, nkv, hd, seq), name="k_heads")
            if cos_c is not None and sin_c is not None:
                qh = R.apply(g, qh, cos_c, sin_c, 2, "rope_q")
                kh = R.apply(g, kh, cos_c, sin_c, 2, "rope_k")
                self.cache_k = g.reshape(kh, (1, a.kv_dim, 1, seq), name="k_rot")
            else:
                self.cache_k = k
            self.cache_v = v
            qg = g.reshape(g.transpose(qh, (0, 1, 3, 2), name="q_t"),
                           (1, nkv, groups * seq, hd), name="q_groups")  # [1, KV, G*S, hd]
            kt = g.transpose(kh, (0, 1, 3, 2), name="k_t")              # [1, KV, S, hd]
            vh = g.reshape(v, (1, nkv, hd, seq), name="v_heads")        # [1, KV, hd, S]
            scores = g.matmul(qg, kt, transpose_y=True, name="scores")  # [1, KV, G*S, S]
            mask = np.tile(window_mask(seq, spec.window), (1, 1, groups, 1))
            masked = g.add(g.mul(scores, spec.scale, name="scaled"),
                           g.const(mask, name="mask"), name="masked")
            p = g.softmax(masked, axis=-1, name="probs")
            o = g.matmul(p, vh, transpose_y=True, name="o")             # [1, KV, G*S, hd]
            o = g.transpose(g.reshape(o, (1, nh, seq, hd), name="o_heads"), (0, 1, 3, 2),
                            name="o_t")
            return g.reshape(o, (1, a.q_dim, 1, seq), name="o_merged")


class Train(Prefill):
    """Prefill's math for a training program (its cache values go unused)."""


@dataclass(frozen=True)
class RowLayout:
    """The grid of the decode surfaces: rows of `width` = lcm(KVD, 32) (KVD itself when
    it is a multiple of 32, ANE-C22), so a head-major cache [KV, T, hd] fills whole rows
    at every bucket T (a multiple of 32), and a [D] row folded into `rows` rows of it,
    zero-padded at the end when D is not a multiple of the width."""

    rows: int
    width: int

    @classmethod
    def of(cls, arch: Architecture) -> RowLayout:
        width = math.lcm(arch.args.kv_dim, ROW_ALIGN)
        return cls(-(-arch.args.dim // width), width)

    @property
    def items(self) -> int:
        """Items of a folded [D] row: its D values, then the zero padding."""
        return self.rows * self.width

    def cache_rows(self, kv_dim: int, cache: int) -> int:
        """Surface rows of a [KV, T, hd] cache of T = `cache` positions."""
        return cache * kv_dim // self.width


def unfold_row(g: Graph, rows: Value, dim: int, name: str) -> Value:
    """[1, R, 1, W] (a row folded by `RowLayout`) -> the column [1, dim, 1, 1]."""
    col = g.reshape(rows, (1, rows.shape[1] * rows.shape[3], 1, 1), name=name)
    if col.shape[1] == dim:
        return col
    return g.slice(col, (0, 0, 0, 0), (1, dim, 1, 1), name=f"{name}_cut")


def fold_row(g: Graph, col: Value, lay: RowLayout, name: str) -> Value:
    """The column [1, D, 1, 1] -> [1, R, 1, W], zero-padded (the inverse of unfold_row)."""
    pad = lay.items - col.shape[1]
    if pad:
        col = g.pad(col, ((0, 0), (0, pad), (0, 0), (0, 0)), name=f"{name}_pad")
    return g.reshape(col, (1, lay.rows, 1, lay.width), name=name)


class Decode(Block):
    """One token against the KV cache. `attach` gives it the layer's inputs before
    anything else is built (a program declares every input first: the declared order
    is the binding order, ANE-C20)."""

    k_new: Value
    v_new: Value

    def attach(self, cache: int, k_cache: Value, v_cache: Value, mask: Value,
               rope: Value | None) -> None:
        """The layer's k_cache, v_cache [1, T*KVD/W, 1, W], mask [1, T, 1, 1] and, for a
        rotary layer, rope [1, 2, 1, hd] (`programs.declare_step_inputs`)."""
        self.cache = cache
        self.k_cache, self.v_cache, self.mask, self.rope_in = k_cache, v_cache, mask, rope

    def attention(self, q: Value, k: Value, v: Value) -> Value:
        g, a = self.g, self.args
        nh, nkv, hd = a.n_heads, a.n_kv_heads, a.head_dim
        cos = sin = None
        if self.rope_in is not None:
            cos = g.slice(self.rope_in, (0, 0, 0, 0), (1, 1, 1, hd), name="cos")
            sin = g.slice(self.rope_in, (0, 1, 0, 0), (1, 1, 1, hd), name="sin")
        with g.composite("attention", "attn"):
            o, kn, vn = self._attend(g.reshape(q, (1, nh, 1, hd), name="q_heads"),
                                     g.reshape(k, (1, nkv, 1, hd), name="k_heads"),
                                     g.reshape(v, (1, nkv, 1, hd), name="v_heads"), cos, sin, 1)
            attn = g.reshape(o, (1, a.q_dim, 1, 1), name="o_col")
        self.k_new = g.reshape(kn, (1, 1, 1, a.kv_dim), name="k_row")
        self.v_new = g.reshape(vn, (1, 1, 1, a.kv_dim), name="v_row")
        return attn

    def _attend(self, qh: Value, kn: Value, vn: Value, cos: Value | None, sin: Value | None,
                lead: int) -> tuple[Value, Value, Value]:
        """The attention of `lead` rows (1 here; a batch's slots in batched decode),
        each against its own cache block and mask: q, k, v heads [L, H or KV, 1, hd]
        -> (o [L, KV, G, hd], the new keys with RoPE, the new values). The new key and
        value join the cached ones by pad + add, under one softmax over T + 1 scores."""
        g, a, spec = self.g, self.args, self.spec
        assert spec is not None
        nh, nkv, hd, cache = a.n_heads, a.n_kv_heads, a.head_dim, self.cache
        groups = nh // nkv
        if cos is not None and sin is not None:
            qh = R.apply(g, qh, cos, sin, 3, "rope_q")
            kn = R.apply(g, kn, cos, sin, 3, "rope_k")
        qg = g.reshape(qh, (lead, nkv, groups, hd), name="q_groups")   # [L, KV, G, hd]
        kh = g.reshape(self.k_cache, (lead, nkv, cache, hd), name="kc_heads")
        vh = g.reshape(self.v_cache, (lead, nkv, cache, hd), name="vc_heads")
        old = g.add(g.matmul(qg, kh, transpose_y=True, name="scores"),  # [L, KV, G, T]
                    g.reshape(self.mask, (lead, 1, 1, cache), name="mask_row"),
                    name="masked")
        new = g.reduce_sum(g.mul(qg, kn, name="qk_new"), 3, name="score_new")
        joined = g.add(g.pad(old, ((0, 0), (0, 0), (0, 0), (0, 1)), name="old_p"),
                       g.pad(new, ((0, 0), (0, 0), (0, 0), (cache, 0)), name="new_p"),
                       name="joined")
        p = g.softmax(g.mul(joined, spec.scale, name="scaled"), axis=-1, name="probs")
        p_old = g.slice(p, (0, 0, 0, 0), (lead, nkv, groups, cache), name="p_old")
        p_new = g.slice(p, (0, 0, 0, cache), (lead, nkv, groups, 1), name="p_new")
        o = g.add(g.matmul(p_old, vh, name="o_old"),                  # [L, KV, G, hd]
                  g.mul(p_new, vn, name="o_new"), name="o")
        return o, kn, vn


# ---- verify: K rows of one sequence against the cache (speculative decoding) --------


def unfold_rows(g: Graph, rows: Value, dim: int, count: int, name: str) -> Value:
    """[1, K*R, 1, W] (K rows folded by `RowLayout`, one after another) -> the columns
    [1, dim, 1, K]: the verify program's x, as `unfold_row` is decode's."""
    width = rows.shape[1] * rows.shape[3] // count
    flat = g.reshape(rows, (1, 1, count, width), name=f"{name}_flat")
    if width != dim:
        flat = g.slice(flat, (0, 0, 0, 0), (1, 1, count, dim), name=f"{name}_cut")
    cols = g.transpose(flat, (0, 1, 3, 2), name=f"{name}_t")          # [1, 1, D, K]
    return g.reshape(cols, (1, dim, 1, count), name=name)


def fold_rows(g: Graph, cols: Value, lay: RowLayout, name: str) -> Value:
    """The columns [1, D, 1, K] -> [1, K*R, 1, W], each zero-padded (`unfold_rows`'
    inverse). Outputs leave multi-row programs so: a surface of whole rows of the
    width W is filled as it is, where a [D, K] block of a W-wide surface would make the
    device pad every one of its D rows out to W."""
    count = cols.shape[3]
    t = g.transpose(g.reshape(cols, (1, 1, cols.shape[1], count), name=f"{name}_cols"),
                    (0, 1, 3, 2), name=f"{name}_t")                      # [1, 1, K, D]
    pad = lay.items - cols.shape[1]
    if pad:
        t = g.pad(t, ((0, 0), (0, 0), (0, 0), (0, pad)), name=f"{name}_pad")
    return g.reshape(t, (1, count * lay.rows, 1, lay.width), name=name)


class Verify(Block):
    """K rows of one sequence at positions p .. p+K-1 against the cache [0, p), in one
    program (speculative decoding's check of K drafted tokens). Decode's inputs, each
    for K rows: k_cache, v_cache as decode binds them (the same surfaces), a mask
    [1, T, 1, K] per window (column j: what row j at p + j sees of the cache; column 0
    is decode's mask at p), a rope [1, 2K, 1, hd] (K cos rows, then K signed-sin rows).
    Among the K new rows the mask is causal (and windowed) and baked. The new keys and
    values join as decode's do (pad + add, one softmax over T + K scores); k_new, v_new
    are [1, K, 1, KVD] (a row a position, head-major channels)."""

    k_new: Value
    v_new: Value

    def attach(self, cache: int, rows: int, k_cache: Value, v_cache: Value, mask: Value,
               rope: Value | None) -> None:
        self.cache, self.rows = cache, rows
        self.k_cache, self.v_cache, self.mask, self.rope_in = k_cache, v_cache, mask, rope

    def attention(self, q: Value, k: Value, v: Value) -> Value:
        g, a, spec = self.g, self.args, self.spec
        assert spec is not None
        nh, nkv, hd, cache, n = a.n_heads, a.n_kv_heads, a.head_dim, self.cache, self.rows
        groups = nh // nkv
        cos = sin = None
        if self.rope_in is not None:
            cos = g.reshape(g.slice(self.rope_in, (0, 0, 0, 0), (1, n, 1, hd), name="cos_rows"),
                            (1, 1, n, hd), name="cos")
            sin = g.reshape(g.slice(self.rope_in, (0, n, 0, 0), (1, n, 1, hd), name="sin_rows"),
                            (1, 1, n, hd), name="sin")
        with g.composite("attention", "attn"):
            def rows_of(x: Value, heads: int, what: str) -> Value:
                """[1, H*hd, 1, K] -> [1, H, K, hd]"""
                return g.transpose(g.reshape(x, (1, heads, hd, n), name=f"{what}_heads"),
                                   (0, 1, 3, 2), name=f"{what}_rows")

            qh, kn, vn = rows_of(q, nh, "q"), rows_of(k, nkv, "k"), rows_of(v, nkv, "v")
            if cos is not None and sin is not None:
                qh = R.apply(g, qh, cos, sin, 3, "rope_q")
                kn = R.apply(g, kn, cos, sin, 3, "rope_k")
            qg = g.reshape(qh, (1, nkv, groups * n, hd), name="q_groups")  # [1, KV, G*K, hd]
            kh = g.reshape(self.k_cache, (1, nkv, cache, hd), name="kc_heads")
            vh = g.reshape(self.v_cache, (1, nkv, cache, hd), name="vc_heads")
            mask = g.transpose(g.reshape(self.mask, (1, 1, cache, n), name="mask_tk"),
                               (0, 1, 3, 2), name="mask_rows")              # [1, 1, K, T]
            old = g.add(g.reshape(g.matmul(qg, kh, transpose_y=True, name="scores"),
                                  (1, nh, n, cache), name="scores_h"), mask, name="masked")
            causal = g.const(window_mask(n, spec.window), name="causal")    # [1, 1, K, K]
            new = g.add(g.reshape(g.matmul(qg, kn, transpose_y=True, name="scores_new"),
                                  (1, nh, n, n), name="scores_new_h"), causal,
                        name="masked_new")
            joined = g.add(g.pad(old, ((0, 0), (0, 0), (0, 0), (0, n)), name="old_p"),
                           g.pad(new, ((0, 0), (0, 0), (0, 0), (cache, 0)), name="new_p"),
                           name="joined")
            p = g.softmax(g.mul(joined, spec.scale, name="scaled"), axis=-1, name="probs")
            p_old = g.reshape(g.slice(p, (0, 0, 0, 0), (1, nh, n, cache), name="p_old"),
                              (1, nkv, groups * n, cache), name="p_old_g")
            p_new = g.reshape(g.slice(p, (0, 0, 0, cache), (1, nh, n, n), name="p_new"),
                              (1, nkv, groups * n, n), name="p_new_g")
            o = g.add(g.matmul(p_old, vh, name="o_old"),                     # [1, KV, G*K, hd]
                      g.matmul(p_new, vn, name="o_new"), name="o")
            o = g.transpose(g.reshape(o, (1, nh, n, hd), name="o_heads"), (0, 1, 3, 2),
                            name="o_t")
            attn = g.reshape(o, (1, a.q_dim, 1, n), name="o_cols")
        self.k_new = position_rows(g, kn, a.kv_dim, "k")
        self.v_new = position_rows(g, vn, a.kv_dim, "v")
        return attn


def position_rows(g: Graph, x: Value, kv_dim: int, name: str) -> Value:
    """New keys or values [L, KV, K, hd] -> [1, L*K, 1, KVD]: a row a position, its
    channels head-major, as the cache holds them (a multi-row program's k_new, v_new)."""
    lead, _, rows, _ = x.shape
    return g.reshape(g.transpose(x, (0, 2, 1, 3), name=f"{name}_t"),
                     (1, lead * rows, 1, kv_dim), name=f"{name}_rows")
