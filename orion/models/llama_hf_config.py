"""A Hugging Face `config.json` of the Llama family -> `LlamaConfig`, validated.

Every value is checked for type and a sane range before anything is allocated from
it, and every field that changes the math is either implemented or refused: a config
is never loaded as a silently different model. Errors are `ModelLoadError`s that
name the file and the field. `model_type` picks the family's defaults:

    llama    Llama 2, Llama 3.x (rope_scaling "llama3"), TinyLlama, SmolLM
    mistral  Mistral (sliding_window bounds the context)
    qwen2    Qwen2 / Qwen2.5 (q/k/v biases)
    qwen3    Qwen3 (per-head q/k RMSNorm, explicit head_dim)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orion.errors import ModelLoadError
from orion.models.llama_config import LlamaConfig, RopeScaling

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
# Generous bounds: far above every published model, far below what would exhaust memory.
MAX_WIDTH = 65536
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_VOCAB = 1 << 21
MAX_POSITIONS = 1 << 24
ROPE_KINDS = ("default", "linear", "llama3")
# Fields that change the math in ways Orion does not implement, with the value that
# is harmless (absent or this value is fine).
_REFUSED_IF_SET = {
    "mlp_bias": False,
    "use_sliding_window": False,
    "quantization_config": None,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "partial_rotary_factor": 1.0,
}


class _Fields:
    def __init__(self, d: Mapping[str, Any], where: str) -> None:
        self.d, self.where = d, where

    def fail(self, field: str, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: {field} {what}")

    def int(self, field: str, lo: int, hi: int, default: int | None = None) -> int:
        v = self.d.get(field, default)
        if v is None:
            if default is None:
                raise self.fail(field, "is missing")
            v = default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(field, f"must be an integer, is {type(v).__name__}")
        if not lo <= v <= hi:
            raise self.fail(field, f"is {v}, outside [{lo}, {hi}]")
        return v

    def float(self, field: str, lo: float, hi: float, default: float,
              d: Mapping[str, Any] | None = None) -> float:
        v = (self.d if d is None else d).get(field, default)
        if v is None:
            v = default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(field, f"must be a number, is {type(v).__name__}")
        if not (math.isfinite(v) and lo < v <= hi):
            raise self.fail(field, f"is {v}, outside ({lo}, {hi}]")
        return float(v)

    def bool(self, field: str, default: bool) -> bool:
        v = self.d.get(field, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(field, f"must be true or false, is {type(v).__name__}")
        return v


def _rope(f: _Fields) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from the classic fields (rope_theta, rope_scaling)
    or transformers 5's `rope_parameters`."""
    params = f.d.get("rope_parameters")
    scaling = f.d.get("rope_scaling")
    field = "rope_scaling"
    if params is not None:
        if not isinstance(params, Mapping):
            raise f.fail("rope_parameters", "must be an object")
        scaling, field = params, "rope_parameters"
    theta = f.float("rope_theta", 0.0, 1e12, 10000.0,
                    params if params is not None and "rope_theta" in params else None)
    if scaling is None or scaling == {}:
        return theta, None
    if not isinstance(scaling, Mapping):
        raise f.fail(field, "must be an object")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise f.fail(f"{field}.rope_type", f"{kind!r} is not implemented (Orion has "
                     f"{', '.join(ROPE_KINDS)})")
    if scaling.get("partial_rotary_factor", 1.0) not in (None, 1, 1.0):
        raise f.fail(f"{field}.partial_rotary_factor", "other than 1 is not implemented")
    if kind == "default":
        return theta, None
    sub = _Fields(scaling, f.where)
    factor = sub.float("factor", 0.0, 1e6, 1.0)
    if kind == "linear":
        return theta, RopeScaling("linear", factor)
    low = sub.float("low_freq_factor", 0.0, 1e6, 1.0)
    high = sub.float("high_freq_factor", 0.0, 1e6, 4.0)
    if high <= low:
        raise f.fail(f"{field}.high_freq_factor", f"{high} must exceed low_freq_factor {low}")
    old = sub.int("original_max_position_embeddings", 1, MAX_POSITIONS, 8192)
    if "attention_factor" in scaling and scaling["attention_factor"] not in (None, 1, 1.0):
        raise f.fail(f"{field}.attention_factor", "other than 1 is not implemented")
    return theta, RopeScaling("llama3", factor, low, high, old)


def config_from_hf(d: Mapping[str, Any], where: str = "config.json") -> LlamaConfig:
    """The validated `LlamaConfig` of a Llama-family config.json (see the module doc)."""
    if not isinstance(d, Mapping):
        raise ModelLoadError(f"{where}: expected a JSON object")
    f = _Fields(d, where)
    family = d.get("model_type", "llama")
    if family not in FAMILIES:
        raise f.fail("model_type", f"{family!r} is not a Llama-family type "
                     f"({', '.join(FAMILIES)})")
    for field, harmless in _REFUSED_IF_SET.items():
        if d.get(field, harmless) not in (harmless, None):
            raise f.fail(field, f"= {d[field]!r} changes the model in a way Orion does not "
                         "implement")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise f.fail("hidden_act", f"{act!r} is not implemented (only silu)")
    layer_types = d.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or any(
            t != "full_attention" for t in layer_types)):
        raise f.fail("layer_types", "other than all full_attention is not implemented")
    dim = f.int("hidden_size", 1, MAX_WIDTH)
    heads = f.int("num_attention_heads", 1, MAX_HEADS)
    kv_heads = f.int("num_key_value_heads", 1, heads, heads)
    if heads % kv_heads:
        raise f.fail("num_key_value_heads", f"{kv_heads} does not divide "
                     f"num_attention_heads {heads}")
    explicit = d.get("head_dim")
    head_dim = f.int("head_dim", 2, MAX_HEAD_DIM) if explicit is not None else 0
    if not head_dim and dim % heads:
        raise f.fail("hidden_size", f"{dim} is not a multiple of num_attention_heads {heads}")
    if (head_dim or dim // heads) % 2:
        raise f.fail("head_dim", f"{head_dim or dim // heads} must be even for RoPE")
    theta, scaling = _rope(f)
    window = 0
    if family == "mistral" and d.get("sliding_window") is not None:
        window = f.int("sliding_window", 1, MAX_POSITIONS)
    attention_bias = f.bool("attention_bias", False)
    try:
        return LlamaConfig(
            dim=dim,
            n_layers=f.int("num_hidden_layers", 1, MAX_LAYERS),
            n_heads=heads,
            n_kv_heads=kv_heads,
            vocab_size=f.int("vocab_size", 1, MAX_VOCAB),
            hidden_dim=f.int("intermediate_size", 1, 16 * MAX_WIDTH),
            max_seq_len=f.int("max_position_embeddings", 1, MAX_POSITIONS, 2048),
            norm_eps=f.float("rms_norm_eps", 0.0, 1.0, 1e-6),
            rope_theta=theta,
            tie_embeddings=f.bool("tie_word_embeddings", False),
            head_size=head_dim if head_dim != dim // heads else 0,
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family != "qwen2" and attention_bias,
            qk_norm=family == "qwen3",
            rope_scaling=scaling,
            sliding_window=window,
            model_type=family,
        )
    except ValueError as exc:  # a combination the dataclass refuses
        raise ModelLoadError(f"{where}: {exc}") from exc


def hf_config(cfg: LlamaConfig) -> dict[str, object]:
    """config.json for `transformers.LlamaConfig` (and for `orion.load`): a plain Llama."""
    if not cfg.plain:
        raise ValueError("hf_config writes plain Llama configs only")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
