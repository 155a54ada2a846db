"""Phi-3 / Phi-3.5: Llama's layer with one fused q/k/v projection (`qkv_proj`) and one
fused gate/up projection (`gate_up_proj`), LongRoPE scaling (`rope_scaling` type
"longrope": per-frequency factors and a cos/sin magnitude correction), and a sliding
window on every layer when the config sets one.

LongRoPE switches to its long factors for sequences past
original_max_position_embeddings; Orion serves the context within it (the short
factors, what transformers uses for every sequence that fits), so `max_positions` is
capped there.
"""

from __future__ import annotations

from typing import Any

from orion.ir.graph import Value
from orion.models.architectures import llama
from orion.models.blocks import Block, gated_mlp, split_qkv
from orion.models.config_reader import MAX_POSITIONS, ConfigReader, rope_settings

Args = llama.Args


class Model(llama.Model):
    title = "Phi-3"

    @classmethod
    def read(cls, c: ConfigReader, **extra: Any) -> dict[str, Any]:
        c.refuse_unless("partial_rotary_factor", 1, 1.0)
        c.refuse_unless("attention_bias", False)
        plain = {k: v for k, v in c.d.items() if k not in ("rope_scaling", "rope_parameters")}
        fields = super().read(ConfigReader(plain, c.where), **extra)
        theta, scaling = rope_settings(c, fields["head_dim"],
                                       max_positions=fields["max_positions"],
                                       kinds=("default", "longrope"))
        original = c.int("original_max_position_embeddings", 1, MAX_POSITIONS,
                         fields["max_positions"])
        window = c.int("sliding_window", 1, MAX_POSITIONS) \
            if c.d.get("sliding_window") is not None else 0
        fields.update(rope_theta=theta, rope_scaling=scaling,
                      max_positions=min(fields["max_positions"], original),
                      windows=(window,) * fields["n_layers"])
        return fields

    def to_config(self) -> dict[str, Any]:
        out = dict(super().to_config(), architectures=["Phi3ForCausalLM"], model_type="phi3")
        s = self.args.rope_scaling
        if s is not None:
            out["rope_scaling"] = {"type": "longrope", "short_factor": list(s.short_factor),
                                   "long_factor": list(s.long_factor)}
            out["original_max_position_embeddings"] = s.original_max_position_embeddings
            out["max_position_embeddings"] = round(s.factor *
                                                   s.original_max_position_embeddings)
        window = max(self.args.windows, default=0)
        out["sliding_window"] = window or None
        return out

    def layer_parameters(self, layer: int) -> dict[str, tuple[int, ...]]:
        a = self.args
        d, h, q, kv = a.dim, a.hidden_dim, a.q_dim, a.kv_dim
        return {
            "input_layernorm.weight": (d,),
            "self_attn.qkv_proj.weight": (q + 2 * kv, d),
            "self_attn.o_proj.weight": (d, q),
            "post_attention_layernorm.weight": (d,),
            "mlp.gate_up_proj.weight": (2 * h, d),
            "mlp.down_proj.weight": (d, h),
        }

    def layer(self, b: Block, x: Value) -> Value:
        h = b.rms_norm(x, "input_layernorm.weight", name="att_norm")
        q, k, v = split_qkv(b, b.linear(h, "self_attn.qkv_proj"))
        x = b.add(x, b.linear(b.attention(q, k, v), "self_attn.o_proj"), "h_att")
        hn = b.rms_norm(x, "post_attention_layernorm.weight", name="ffn_norm")
        return b.add(x, gated_mlp(b, hn, b.silu, gate_up="mlp.gate_up_proj"), "y")
