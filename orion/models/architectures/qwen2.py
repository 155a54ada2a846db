"""Qwen2 / Qwen2.5: Llama's layer with biases on q, k and v (never on o), and a sliding
window on the layers from `max_window_layers` on when `use_sliding_window` is set."""

from __future__ import annotations

from typing import Any

from orion.models.architectures import llama
from orion.models.config_reader import MAX_LAYERS, MAX_POSITIONS, ConfigReader

Args = llama.Args


class Model(llama.Model):
    title = "Qwen2"
    refused = {k: v for k, v in llama.REFUSED_UNLESS.items() if k != "use_sliding_window"}

    @classmethod
    def read(cls, c: ConfigReader, **extra: Any) -> dict[str, Any]:
        fields = super().read(c, **extra)
        fields.update(qkv_bias=True, o_bias=False)
        n = fields["n_layers"]
        if c.bool("use_sliding_window", False) and c.d.get("layer_types") is None:
            window = c.int("sliding_window", 1, MAX_POSITIONS)
            first = c.int("max_window_layers", 0, MAX_LAYERS, n)
            fields["windows"] = tuple(window if i >= first else 0 for i in range(n))
        return fields

    def to_config(self) -> dict[str, Any]:
        return dict(super().to_config(), architectures=["Qwen2ForCausalLM"],
                    model_type="qwen2", attention_bias=None, use_sliding_window=False)
