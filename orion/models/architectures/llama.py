"""Llama (Llama 2, Llama 3.x, TinyLlama, SmolLM2, llama2.c's Stories models): RMSNorm,
rotary embeddings (rotate-half, as Hugging Face stores q/k), SwiGLU, grouped-query
attention, optional attention biases, a tied or untied classifier.

Mistral, Qwen2 and Qwen3 build on this file and change what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.errors import ModelLoadError
from orion.ir.graph import Value
from orion.models.architecture import Architecture, AttentionSpec, TransformerArgs
from orion.models.blocks import Block, gated_mlp
from orion.models.config_reader import (
    MAX_POSITIONS,
    ConfigReader,
    layer_windows,
    rope_settings,
    transformer_config,
    transformer_fields,
)
from orion.models.rope import Rope, RopeScaling


@dataclass(frozen=True)
class Args(TransformerArgs):
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False         # biases on q, k, v (attention_bias; Qwen2 always)
    o_bias: bool = False           # a bias on o (attention_bias)
    windows: tuple[int, ...] = ()  # per layer: 0 full attention, W the last W positions

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim {self.head_dim} must be even for rotary "
                                 "embeddings")
        if isinstance(self.rope_scaling, dict):   # from_dict of a checkpoint
            d = dict(self.rope_scaling)
            for k in ("short_factor", "long_factor"):
                d[k] = tuple(d.get(k, ()))
            object.__setattr__(self, "rope_scaling", RopeScaling(**d))
        object.__setattr__(self, "windows", tuple(self.windows) or (0,) * self.n_layers)


# Settings that change the math in ways this file does not implement, with the values
# that are harmless (absent or null is always fine).
REFUSED_UNLESS: dict[str, tuple[Any, ...]] = {
    "mlp_bias": (False,),
    "quantization_config": (),
    "attn_logit_softcapping": (),
    "final_logit_softcapping": (),
    "partial_rotary_factor": (1, 1.0),
    "use_sliding_window": (False,),   # Qwen2's switch; Qwen2's file reads it
}


class Model(Architecture):
    Args = Args
    title = "Llama"
    refused = REFUSED_UNLESS
    args: Args

    @classmethod
    def read(cls, c: ConfigReader, **extra: Any) -> dict[str, Any]:
        """The fields of a Llama-family config (the files built on this one add theirs)."""
        for field, harmless in cls.refused.items():
            c.refuse_unless(field, *harmless)
        c.one_of("hidden_act", ("silu",), "silu")
        fields = transformer_fields(c, default_eps=1e-6)
        theta, scaling = rope_settings(c, fields["head_dim"],
                                       max_positions=fields["max_positions"])
        bias = c.bool("attention_bias", False)
        window = c.int("sliding_window", 1, MAX_POSITIONS, 0) \
            if c.d.get("sliding_window") is not None else 0
        return dict(fields, rope_theta=theta, rope_scaling=scaling, qkv_bias=bias,
                    o_bias=bias, windows=layer_windows(c, fields["n_layers"], window),
                    **extra)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> Model:
        return cls(cls.Args(**cls.read(ConfigReader(config, where))))

    def to_config(self) -> dict[str, Any]:
        a = self.args
        out: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            **transformer_config(a), "rope_theta": a.rope_theta, "hidden_act": "silu",
            "attention_bias": a.qkv_bias, "mlp_bias": False,
        }
        if a.rope_scaling is not None:
            s = a.rope_scaling
            out["rope_scaling"] = (
                {"rope_type": "linear", "factor": s.factor} if s.kind == "linear" else
                {"rope_type": "llama3", "factor": s.factor,
                 "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                 "original_max_position_embeddings": s.original_max_position_embeddings})
        return out

    def layer_parameters(self, layer: int) -> dict[str, tuple[int, ...]]:
        a = self.args
        d, h, q, kv = a.dim, a.hidden_dim, a.q_dim, a.kv_dim
        out: dict[str, tuple[int, ...]] = {
            "input_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (q, d),
            "self_attn.k_proj.weight": (kv, d),
            "self_attn.v_proj.weight": (kv, d),
            "self_attn.o_proj.weight": (d, q),
            "post_attention_layernorm.weight": (d,),
            "mlp.gate_proj.weight": (h, d),
            "mlp.up_proj.weight": (h, d),
            "mlp.down_proj.weight": (d, h),
        }
        if a.qkv_bias:
            out.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                        "self_attn.v_proj.bias": (kv,)})
        if a.o_bias:
            out["self_attn.o_proj.bias"] = (d,)
        return out

    def attention(self, layer: int) -> AttentionSpec:
        a = self.args
        return AttentionSpec(Rope(a.rope_theta, a.head_dim, a.rope_scaling),
                             a.windows[layer], 1.0 / float(np.sqrt(a.head_dim)))

    def qk_norms(self, b: Block, q: Value, k: Value) -> tuple[Value, Value]:
        """Norms of q and k before RoPE: none in Llama (Qwen3 has them)."""
        return q, k

    def layer(self, b: Block, x: Value) -> Value:
        a = self.args
        h = b.rms_norm(x, "input_layernorm.weight", name="att_norm")
        q = b.linear(h, "self_attn.q_proj", a.qkv_bias)
        k = b.linear(h, "self_attn.k_proj", a.qkv_bias)
        v = b.linear(h, "self_attn.v_proj", a.qkv_bias)
        q, k = self.qk_norms(b, q, k)
        x = b.add(x, b.linear(b.attention(q, k, v), "self_attn.o_proj", a.o_bias), "h_att")
        hn = b.rms_norm(x, "post_attention_layernorm.weight", name="ffn_norm")
        return b.add(x, gated_mlp(b, hn, b.silu), "y")

    def final_norm(self, b: Block, x: Value) -> Value:
        return b.rms_norm(x, "model.norm.weight", name="final_norm")
