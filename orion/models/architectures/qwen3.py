"""Qwen3: Llama's layer with an RMSNorm of each query and key head before RoPE, and an
explicit head_dim."""

from __future__ import annotations

from typing import Any

from orion.ir.graph import Value
from orion.models.architectures import qwen2
from orion.models.blocks import Block
from orion.models.config_reader import ConfigReader

Args = qwen2.Args


class Model(qwen2.Model):
    title = "Qwen3"

    @classmethod
    def read(cls, c: ConfigReader, **extra: Any) -> dict[str, Any]:
        fields = super().read(c, **extra)
        bias = c.bool("attention_bias", False)
        fields.update(qkv_bias=bias, o_bias=bias)
        return fields

    def to_config(self) -> dict[str, Any]:
        return dict(super().to_config(), architectures=["Qwen3ForCausalLM"],
                    model_type="qwen3", attention_bias=self.args.qkv_bias)

    def layer_parameters(self, layer: int) -> dict[str, tuple[int, ...]]:
        hd = self.args.head_dim
        return {**super().layer_parameters(layer), "self_attn.q_norm.weight": (hd,),
                "self_attn.k_norm.weight": (hd,)}

    def qk_norms(self, b: Block, q: Value, k: Value) -> tuple[Value, Value]:
        a = self.args
        return (b.head_norm(q, a.n_heads, "self_attn.q_norm.weight"),
                b.head_norm(k, a.n_kv_heads, "self_attn.k_norm.weight"))
