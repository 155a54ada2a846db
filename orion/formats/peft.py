"""PEFT's LoRA adapter folder: `adapter_config.json` + `adapter_model.safetensors`.

Each adapted linear layer computes y = W x + s B (A x), with A [r, in], B [out, r] and
s = alpha / r (alpha / sqrt(r) with rsLoRA). `target_modules` names the layers as PEFT
matches them: a name equal to the module's dotted path or one of its dotted suffixes
("q_proj", "self_attn.q_proj"), or "all-linear". `rank_pattern` and `alpha_pattern`
give some modules their own r and alpha; a key is a regex that must match a dotted
suffix of the module's full name (PEFT's `get_pattern_key`). Keys come from files, so a
key whose matching could take exponential time (a repetition over a repetition or an
alternation, "(.*)*x", "(a|aa)+") is refused by name rather than run.

Tensors are named `base_model.model.<module's full name>.lora_A.weight` / `lora_B`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:   # Python 3.11+: the parser under `re`
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

from orion.errors import LoraError, ModelLoadError
from orion.files import MAX_WEIGHT_BYTES, inside, read_json

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
PEFT_TYPE = "LORA"
ALL_LINEAR = "all-linear"
MAX_PATTERN_CHARS = 512

# PEFT options that change the computation and that Orion does not implement, with the
# value that means "off". Anything else set in a config is refused by name.
_OFF: dict[str, Any] = {
    "use_dora": False, "bias": "none", "lora_bias": False,
    "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
    "layer_replication": None, "exclude_modules": None, "target_parameters": None,
    "trainable_token_indices": None, "use_qalora": False, "alora_invocation_tokens": None,
    "use_bdlora": None, "megatron_config": None, "arrow_config": None,
}
# PEFT options that only matter when PEFT initializes, trains or merges an adapter
# (fan_in_fan_out: the base stores W as [in, out], GPT-2's Conv1D; A and B are the same)
_IGNORED = {"init_lora_weights", "loftq_config", "eva_config", "corda_config",
            "kasa_config", "lora_ga_config", "monteclora_config", "inference_mode",
            "revision", "task_type", "auto_mapping", "peft_version", "megatron_core",
            "qalora_group_size", "ensure_weight_tying", "velora_config", "layers_pattern",
            "fan_in_fan_out"}


def check_pattern(key: str) -> None:
    """Refuses a pattern key that is not a regex, is too long, or nests repetition
    (a repeated group holding a repeat or an alternation: catastrophic backtracking)."""
    if len(key) > MAX_PATTERN_CHARS:
        raise LoraError(f"pattern {key[:40]!r}... is over {MAX_PATTERN_CHARS} characters")
    try:
        parsed = sre_parse.parse(key)
    except re.error as exc:
        raise LoraError(f"pattern {key!r} is not a valid regex: {exc}") from None

    def walk(items: Any, under_repeat: bool) -> None:
        for op, arg in items:
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                lo, hi, body = arg
                if under_repeat and hi != 0:
                    raise LoraError(f"pattern {key!r} repeats a repetition, which can take "
                                    "exponential time to match; write it without nesting")
                walk(body, under_repeat or hi not in (0, 1))
            elif name == "BRANCH":
                if under_repeat:
                    raise LoraError(f"pattern {key!r} repeats an alternation, which can take "
                                    "exponential time to match; write it without one")
                for alt in arg[1]:
                    walk(alt, under_repeat)
            elif name == "SUBPATTERN":
                walk(arg[-1], under_repeat)
            elif name in ("ASSERT", "ASSERT_NOT"):
                walk(arg[1], under_repeat)
            elif name == "GROUPREF_EXISTS":
                raise LoraError(f"pattern {key!r}: conditional groups are not supported")

    walk(parsed, False)


def _pattern(patterns: Mapping[str, Any], name: str, default: Any) -> Any:
    """PEFT's `get_pattern_key`: the first key that matches a dotted suffix of `name`."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def matches_target(full_name: str, target: str) -> bool:
    """PEFT's rule for one target_modules entry: the name itself or a dotted suffix."""
    return full_name == target or full_name.endswith("." + target)


@dataclass(frozen=True)
class LoraConfig:
    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")   # as target_modules, or all-linear
    dropout: float = 0.0
    use_rslora: bool = False
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    base_model: str | None = None

    def __post_init__(self) -> None:
        if not self.targets:
            raise LoraError("target_modules is empty")
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0 or any(
                isinstance(v, bool) or not isinstance(v, int) or v <= 0
                for v in self.rank_pattern.values()):
            raise LoraError(f"rank r must be a positive integer (r={self.r!r}, "
                            f"rank_pattern={dict(self.rank_pattern)})")
        alphas = [self.alpha, *self.alpha_pattern.values()]
        if any(isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a)
               or not 0 < a <= 1e4 for a in alphas):
            raise LoraError(f"lora_alpha must be a finite number in (0, 10000] "
                            f"(lora_alpha={self.alpha!r}, alpha_pattern="
                            f"{dict(self.alpha_pattern)})")
        if not 0.0 <= self.dropout < 1.0:
            raise LoraError(f"lora_dropout {self.dropout} is not in [0, 1)")
        for key in [*self.rank_pattern, *self.alpha_pattern]:
            check_pattern(key)
        object.__setattr__(self, "targets", tuple(dict.fromkeys(self.targets)))

    def adapts(self, full_name: str) -> bool:
        """Whether a linear layer's full name ("model.layers.0.self_attn.q_proj") is a
        target."""
        return self.targets == (ALL_LINEAR,) or any(
            matches_target(full_name, t) for t in self.targets)

    def rank(self, full_name: str) -> int:
        return int(_pattern(self.rank_pattern, full_name, self.r))

    def alpha_of(self, full_name: str) -> float:
        return float(_pattern(self.alpha_pattern, full_name, self.alpha))

    def scale(self, full_name: str) -> float:
        """s of y = W x + s B A x, as PEFT computes it."""
        r = self.rank(full_name)
        a = self.alpha_of(full_name)
        return a / math.sqrt(r) if self.use_rslora else a / r

    # ---- adapter_config.json ----------------------------------------------------

    def to_peft(self) -> dict[str, Any]:
        targets: str | list[str] = (ALL_LINEAR if self.targets == (ALL_LINEAR,)
                                    else list(self.targets))
        return {
            "peft_type": PEFT_TYPE, "task_type": "CAUSAL_LM", "r": self.r,
            "lora_alpha": self.alpha, "lora_dropout": self.dropout,
            "target_modules": targets, "use_rslora": self.use_rslora,
            "rank_pattern": dict(self.rank_pattern),
            "alpha_pattern": dict(self.alpha_pattern),
            "base_model_name_or_path": self.base_model, "bias": "none",
            "use_dora": False, "modules_to_save": None,
            "init_lora_weights": True, "inference_mode": True,
        }

    @classmethod
    def from_peft(cls, d: Mapping[str, Any], where: str = CONFIG_FILE) -> LoraConfig:
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
            if targets != ALL_LINEAR:
                raise LoraError(f"{where}: target_modules as a regex ({targets!r}) is not "
                                "supported; list the module names")
            targets = [ALL_LINEAR]
        if not isinstance(targets, list) or not targets or not all(
                isinstance(t, str) and t for t in targets):
            raise LoraError(f"{where}: target_modules must be a list of module names")
        try:
            return cls(r=_exact_int(d["r"], "r"), alpha=_number(d.get("lora_alpha", 8),
                                                                   "lora_alpha"),
                       targets=tuple(targets),
                       dropout=_number(d.get("lora_dropout") or 0.0, "lora_dropout"),
                       use_rslora=_flag(d.get("use_rslora", False), "use_rslora"),
                       rank_pattern={str(k): _exact_int(v, f"rank_pattern[{k!r}]")
                                     for k, v in _object(d, "rank_pattern").items()},
                       alpha_pattern={str(k): _number(v, f"alpha_pattern[{k!r}]")
                                      for k, v in _object(d, "alpha_pattern").items()},
                       base_model=_optional_str(d.get("base_model_name_or_path")))
        except LoraError as exc:
            raise LoraError(f"{where}: {exc}") from None
        except KeyError as exc:
            raise LoraError(f"{where}: no {exc.args[0]!r}") from None


def _exact_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise LoraError(f"{what} must be an integer, is {v!r}"[:200])
    return v


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise LoraError(f"{what} must be a finite number, is {v!r}"[:200])
    return float(v)


def _flag(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise LoraError(f"{what} must be true or false, is {v!r}"[:200])
    return v


def _object(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = d.get(key) or {}
    if not isinstance(v, Mapping):
        raise LoraError(f"{key} must be an object")
    return v


def _optional_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def tensor_name(full_name: str, which: str) -> str:
    """PEFT's name of a module's A or B matrix."""
    return f"{PREFIX}{full_name}.lora_{which}.weight"


def read_adapter(folder: str | os.PathLike[str]) -> tuple[LoraConfig, dict[str, np.ndarray]]:
    """The config and every tensor (fp32, each value finite) of an adapter folder."""
    from orion.formats.safetensors import read_file

    folder = Path(folder)
    if not folder.is_dir():
        raise LoraError(f"{folder}: not an adapter folder")
    cfg_path = inside(folder, CONFIG_FILE)
    if not cfg_path.exists():
        raise LoraError(f"{folder}: no {CONFIG_FILE}")
    config = LoraConfig.from_peft(read_json(cfg_path), str(cfg_path))
    w_path = inside(folder, WEIGHTS_FILE)
    if not w_path.exists():
        raise LoraError(f"{folder}: no {WEIGHTS_FILE} (adapter_model.bin is a pickle, which "
                        "Orion does not read)")
    try:
        tensors, _ = read_file(w_path, max_bytes=MAX_WEIGHT_BYTES, fp16_range=False)
    except ModelLoadError as exc:
        raise LoraError(str(exc)) from None
    return config, tensors


def write_adapter(folder: str | os.PathLike[str], config: LoraConfig,
                  tensors: Mapping[str, np.ndarray]) -> None:
    """PEFT's two files, each written atomically (fp32 tensors)."""
    from orion.atomic import atomic_write_bytes
    from orion.formats.safetensors import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / WEIGHTS_FILE,
                       save(tensors, "float32", metadata={"format": "pt"}))
    text = json.dumps(config.to_peft(), indent=2) + "\n"
    atomic_write_bytes(folder / CONFIG_FILE, text.encode())
