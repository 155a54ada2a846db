"""Mistral: Llama's layer with a sliding attention window on every layer (each token
attends to the `sliding_window` most recent positions, itself included)."""

from __future__ import annotations

from typing import Any

from orion.models.architectures import llama
from orion.models.config_reader import MAX_POSITIONS, ConfigReader

Args = llama.Args


class Model(llama.Model):
    title = "Mistral"

    @classmethod
    def read(cls, c: ConfigReader, **extra: Any) -> dict[str, Any]:
        fields = super().read(c, **extra)
        if c.d.get("sliding_window") is not None and c.d.get("layer_types") is None:
            window = c.int("sliding_window", 1, MAX_POSITIONS)
            fields["windows"] = (window,) * fields["n_layers"]
        return fields

    def to_config(self) -> dict[str, Any]:
        window = max(self.args.windows, default=0)
        return dict(super().to_config(), architectures=["MistralForCausalLM"],
                    model_type="mistral", sliding_window=window or None)
