"""Gemma 3 (text): local sliding-window layers interleaved with global ones, each kind
with its own RoPE base; (1 + w) RMSNorms, also after attention and after the MLP
("sandwich" norms); RMSNorms of the query and key heads; GeGLU (GELU, tanh form); the
embedding scaled by sqrt(hidden_size); scores scaled by query_pre_attn_scalar^-0.5.

The layer kinds come from `layer_types`, or from `sliding_window_pattern` (every n-th
layer global) in the configs published before transformers named them. RoPE comes from
`rope_parameters` (a "sliding_attention" and a "full_attention" entry), or from
`rope_local_base_freq` (local layers) and `rope_theta` with `rope_scaling` (global).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.ir.graph import Value
from orion.models.architecture import Architecture, AttentionSpec, TransformerArgs
from orion.models.blocks import Block, gated_mlp
from orion.models.config_reader import (
    MAX_LAYERS,
    MAX_POSITIONS,
    ConfigReader,
    layer_windows,
    rope_settings,
    transformer_config,
    transformer_fields,
)
from orion.models.rope import Rope, RopeScaling
from orion.models.weights import WeightSource

GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")


@dataclass(frozen=True)
class Args(TransformerArgs):
    query_scale: float = 0.0                   # query_pre_attn_scalar ** -0.5
    local_theta: float = 10000.0
    global_theta: float = 1_000_000.0
    global_scaling: RopeScaling | None = None  # rope_scaling of the global layers
    windows: tuple[int, ...] = ()              # per layer: 0 global, W local
    attention_bias: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.global_scaling, dict):   # from_dict of a checkpoint
            object.__setattr__(self, "global_scaling", RopeScaling(**self.global_scaling))
        object.__setattr__(self, "windows", tuple(self.windows))


class Model(Architecture):
    Args = Args
    title = "Gemma 3"
    norm_init = 0.0          # its norms scale by (1 + w)
    args: Args

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> Model:
        c = ConfigReader(config, where)
        for field in ("final_logit_softcapping", "attn_logit_softcapping",
                      "quantization_config"):
            c.refuse_unless(field)
        c.refuse_unless("use_bidirectional_attention", False)
        c.one_of("hidden_activation", GELU_TANH, "gelu_pytorch_tanh")
        fields = transformer_fields(c, default_eps=1e-6, tie_default=True)
        n = fields["n_layers"]
        window = c.int("sliding_window", 1, MAX_POSITIONS, 4096)
        if c.d.get("layer_types") is None:
            every = c.int("sliding_window_pattern", 1, MAX_LAYERS, 6)
            windows = tuple(window if (i + 1) % every else 0 for i in range(n))
        else:
            windows = layer_windows(c, n, window)
        local, global_theta, scaling = cls._ropes(c, fields)
        return cls(Args(**fields,
                        query_scale=c.int("query_pre_attn_scalar", 1, 1 << 20, 256) ** -0.5,
                        local_theta=local, global_theta=global_theta, global_scaling=scaling,
                        windows=windows, attention_bias=c.bool("attention_bias", False)))

    @staticmethod
    def _ropes(c: ConfigReader, fields: dict[str, Any]
               ) -> tuple[float, float, RopeScaling | None]:
        """(local theta, global theta, global scaling)."""
        params = c.sub("rope_parameters")
        hd, positions = fields["head_dim"], fields["max_positions"]
        if params is not None and ("full_attention" in params.d
                                   or "sliding_attention" in params.d):
            out = []
            for kind, default in (("sliding_attention", 10000.0),
                                  ("full_attention", 1_000_000.0)):
                sub = params.sub(kind) or ConfigReader({}, f"{params.where}.{kind}")
                out.append(rope_settings(ConfigReader({"rope_parameters": dict(sub.d)},
                                                      c.where), hd, max_positions=positions,
                                         kinds=("default", "linear"), theta_default=default))
            (local, local_scaling), (global_theta, scaling) = out
            if local_scaling is not None:
                raise c.fail("rope_parameters.sliding_attention", "scaling the local "
                             "layers' RoPE is not implemented")
            return local, global_theta, scaling
        global_theta, scaling = rope_settings(c, hd, max_positions=positions,
                                              kinds=("default", "linear"),
                                              theta_default=1_000_000.0)
        local = c.float("rope_local_base_freq", 0.0, 1e12, 10000.0)
        return local, global_theta, scaling

    def to_config(self) -> dict[str, Any]:
        a = self.args
        local = [w for w in a.windows if w]
        out: dict[str, Any] = {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            **transformer_config(a),
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": round(a.query_scale ** -2),
            "sliding_window": local[0] if local else 4096,
            "layer_types": ["sliding_attention" if w else "full_attention" for w in a.windows],
            "rope_theta": a.global_theta, "rope_local_base_freq": a.local_theta,
            "attention_bias": a.attention_bias,
        }
        if a.global_scaling is not None:
            out["rope_scaling"] = {"rope_type": "linear", "factor": a.global_scaling.factor}
        return out

    def layer_parameters(self, layer: int) -> dict[str, tuple[int, ...]]:
        a = self.args
        d, h, q, kv, hd = a.dim, a.hidden_dim, a.q_dim, a.kv_dim, a.head_dim
        out: dict[str, tuple[int, ...]] = {
            "input_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (q, d),
            "self_attn.k_proj.weight": (kv, d),
            "self_attn.v_proj.weight": (kv, d),
            "self_attn.o_proj.weight": (d, q),
            "self_attn.q_norm.weight": (hd,),
            "self_attn.k_norm.weight": (hd,),
            "post_attention_layernorm.weight": (d,),
            "pre_feedforward_layernorm.weight": (d,),
            "mlp.gate_proj.weight": (h, d),
            "mlp.up_proj.weight": (h, d),
            "mlp.down_proj.weight": (d, h),
            "post_feedforward_layernorm.weight": (d,),
        }
        if a.attention_bias:
            out.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                        "self_attn.v_proj.bias": (kv,), "self_attn.o_proj.bias": (d,)})
        return out

    def attention(self, layer: int) -> AttentionSpec:
        a = self.args
        window = a.windows[layer]
        rope = (Rope(a.local_theta, a.head_dim) if window
                else Rope(a.global_theta, a.head_dim, a.global_scaling))
        return AttentionSpec(rope, window, a.query_scale)

    def embed(self, w: WeightSource, ids: np.ndarray, start: int) -> np.ndarray:
        return w.rows_fp32(self.embed_name, ids) * np.float32(self.args.dim ** 0.5)

    def embed_backward(self, grads: dict[str, np.ndarray], ids: np.ndarray, start: int,
                       dx: np.ndarray) -> None:
        np.add.at(grads[self.embed_name], ids, dx * np.float32(self.args.dim ** 0.5))

    def layer(self, b: Block, x: Value) -> Value:
        a = self.args
        bias = a.attention_bias
        h = b.rms_norm(x, "input_layernorm.weight", plus_one=True, name="att_norm")
        q = b.head_norm(b.linear(h, "self_attn.q_proj", bias), a.n_heads,
                        "self_attn.q_norm.weight", plus_one=True)
        k = b.head_norm(b.linear(h, "self_attn.k_proj", bias), a.n_kv_heads,
                        "self_attn.k_norm.weight", plus_one=True)
        v = b.linear(h, "self_attn.v_proj", bias)
        o = b.linear(b.attention(q, k, v), "self_attn.o_proj", bias)
        x = b.add(x, b.rms_norm(o, "post_attention_layernorm.weight", plus_one=True,
                                name="post_att_norm"), "h_att")
        m = b.rms_norm(x, "pre_feedforward_layernorm.weight", plus_one=True, name="ffn_norm")
        m = gated_mlp(b, m, b.gelu_tanh)
        return b.add(x, b.rms_norm(m, "post_feedforward_layernorm.weight", plus_one=True,
                                   name="post_ffn_norm"), "y")

    def final_norm(self, b: Block, x: Value) -> Value:
        return b.rms_norm(x, "model.norm.weight", plus_one=True, name="final_norm")
