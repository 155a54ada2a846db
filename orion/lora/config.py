"""A LoRA adapter's hyper-parameters, and PEFT's `adapter_config.json`.

Each adapted linear layer computes y = W x + s B (A x), with A [r, in], B [out, r] and
s = alpha / r (alpha / sqrt(r) with rsLoRA). `rank_pattern` and `alpha_pattern` give
some modules their own r and alpha; their keys match module names as PEFT matches
them (`get_pattern_key`: the key is a regex that must match a suffix of the module's
dotted name, e.g. "down_proj" or "model.layers.0.self_attn.q_proj").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orion.errors import OrionError

# short name -> the module path inside a Llama decoder layer (HF names)
MODULES: dict[str, str] = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
PEFT_TYPE = "LORA"

# PEFT options that change the computation and that Orion does not implement, with the
# value that means "off". Anything else set in a config is refused by name.
_OFF: dict[str, Any] = {
    "use_dora": False, "bias": "none", "lora_bias": False, "fan_in_fan_out": False,
    "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
    "layer_replication": None, "exclude_modules": None, "target_parameters": None,
    "trainable_token_indices": None, "use_qalora": False, "alora_invocation_tokens": None,
    "use_bdlora": None, "megatron_config": None, "arrow_config": None,
}
# PEFT options that only matter when PEFT initializes or trains an adapter
_IGNORED = {"init_lora_weights", "loftq_config", "eva_config", "corda_config",
            "kasa_config", "lora_ga_config", "monteclora_config", "inference_mode",
            "revision", "task_type", "auto_mapping", "peft_version", "megatron_core",
            "qalora_group_size", "ensure_weight_tying", "velora_config", "layers_pattern"}


class LoraError(OrionError, ValueError):
    """An adapter file or option Orion cannot use, named in the message."""


@dataclass(frozen=True)
class LoraConfig:
    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")   # short names, keys of MODULES
    dropout: float = 0.0
    use_rslora: bool = False
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    base_model: str | None = None

    def __post_init__(self) -> None:
        unknown = [t for t in self.targets if t not in MODULES]
        if unknown:
            raise LoraError(f"target_modules {unknown} are not Llama linear layers "
                            f"(Orion adapts {sorted(MODULES)})")
        if not self.targets:
            raise LoraError("target_modules is empty")
        if self.r <= 0 or any(int(v) <= 0 for v in self.rank_pattern.values()):
            raise LoraError(f"rank r must be positive (r={self.r}, "
                            f"rank_pattern={dict(self.rank_pattern)})")
        if not 0.0 <= self.dropout < 1.0:
            raise LoraError(f"lora_dropout {self.dropout} is not in [0, 1)")
        object.__setattr__(self, "targets", tuple(sorted(set(self.targets),
                                                         key=list(MODULES).index)))

    def module_name(self, layer: int, module: str) -> str:
        return f"model.layers.{layer}.{MODULES[module]}"

    def rank(self, layer: int, module: str) -> int:
        return int(_pattern(self.rank_pattern, self.module_name(layer, module), self.r))

    def alpha_of(self, layer: int, module: str) -> float:
        return float(_pattern(self.alpha_pattern, self.module_name(layer, module), self.alpha))

    def scale(self, layer: int, module: str) -> float:
        """s of y = W x + s B A x, as PEFT computes it."""
        r = self.rank(layer, module)
        a = self.alpha_of(layer, module)
        return a / math.sqrt(r) if self.use_rslora else a / r

    # ---- PEFT's adapter_config.json -------------------------------------------

    def to_peft(self) -> dict[str, Any]:
        return {
            "peft_type": PEFT_TYPE, "task_type": "CAUSAL_LM", "r": self.r,
            "lora_alpha": self.alpha, "lora_dropout": self.dropout,
            "target_modules": list(self.targets), "use_rslora": self.use_rslora,
            "rank_pattern": dict(self.rank_pattern),
            "alpha_pattern": dict(self.alpha_pattern),
            "base_model_name_or_path": self.base_model, "bias": "none",
            "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None,
            "init_lora_weights": True, "inference_mode": True,
        }

    @classmethod
    def from_peft(cls, d: Mapping[str, Any], where: str = "adapter_config.json"
                  ) -> LoraConfig:
        if not isinstance(d, Mapping):
            raise LoraError(f"{where}: not a JSON object")
        if d.get("peft_type") != PEFT_TYPE:
            raise LoraError(f"{where}: peft_type {d.get('peft_type')!r} is not 'LORA'")
        for key, off in _OFF.items():
            if key in d and d[key] != off and d[key] not in ({}, []):
                raise LoraError(f"{where}: option {key}={d[key]!r} is not supported by "
                                f"Orion (only {off!r})")
        known = set(_OFF) | _IGNORED | {
            "peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora",
            "rank_pattern", "alpha_pattern", "base_model_name_or_path"}
        for key in sorted(set(d) - known):
            if d[key] not in (None, False, {}, []):
                raise LoraError(f"{where}: option {key}={d[key]!r} is not supported by Orion")
        targets = d.get("target_modules")
        if isinstance(targets, str):
            if targets != "all-linear":
                raise LoraError(f"{where}: target_modules as a regex ({targets!r}) is not "
                                "supported; list the module names")
            targets = list(MODULES)
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise LoraError(f"{where}: target_modules must be a list of module names")
        try:
            return cls(r=int(d["r"]), alpha=float(d.get("lora_alpha", 8)),
                       targets=tuple(targets), dropout=float(d.get("lora_dropout") or 0.0),
                       use_rslora=bool(d.get("use_rslora", False)),
                       rank_pattern={str(k): int(v)
                                     for k, v in (d.get("rank_pattern") or {}).items()},
                       alpha_pattern={str(k): float(v)
                                      for k, v in (d.get("alpha_pattern") or {}).items()},
                       base_model=d.get("base_model_name_or_path"))
        except LoraError as exc:
            raise LoraError(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise LoraError(f"{where}: bad LoRA config ({type(exc).__name__}: {exc})") from None


def _pattern(patterns: Mapping[str, Any], name: str, default: Any) -> Any:
    """PEFT's `get_pattern_key`: the first key that matches a dotted suffix of `name`."""
    for key, value in patterns.items():
        try:
            if re.match(rf"(.*\.)?({key})$", name):
                return value
        except re.error as exc:
            raise LoraError(f"pattern {key!r} is not a valid regex: {exc}") from None
    return default
