"""Typed, bounded reads of a `config.json`: every value an architecture sizes anything
from is checked for type and range before use, and every failure is a
`ModelLoadError` naming the file and the field.

    c = ConfigReader(raw, "path/config.json")
    dim = c.int("hidden_size", 1, MAX_WIDTH)
    eps = c.float("rms_norm_eps", 0.0, 1.0, default=1e-6)
    c.refuse_unless("mlp_bias", False)      # a field that would change the math
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orion.errors import ModelLoadError
from orion.models.rope import RopeScaling

if TYPE_CHECKING:
    from orion.models.architecture import TransformerArgs

# Generous bounds: far above every published model, far below what would exhaust memory.
MAX_WIDTH = 65536
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_VOCAB = 1 << 21
MAX_POSITIONS = 1 << 24
MAX_HIDDEN = 16 * MAX_WIDTH


class ConfigReader:
    def __init__(self, d: Mapping[str, Any], where: str) -> None:
        if not isinstance(d, Mapping):
            raise ModelLoadError(f"{where}: expected a JSON object")
        self.d, self.where = d, where

    def fail(self, field: str, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: {field} {what}"[:500])

    def sub(self, field: str) -> ConfigReader | None:
        """The object under `field` as a reader of its own, None when absent or null."""
        v = self.d.get(field)
        if v is None:
            return None
        if not isinstance(v, Mapping):
            raise self.fail(field, "must be an object")
        return ConfigReader(v, f"{self.where}: {field}")

    def int(self, field: str, lo: int, hi: int, default: int | None = None,
            null_ok: bool = True) -> int:
        """An integer in [lo, hi]; absent (or null, when `null_ok`) gives `default`."""
        if not null_ok and field in self.d and self.d[field] is None:
            raise self.fail(field, "must be an integer, is null")
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

    def optional_int(self, field: str, lo: int, hi: int) -> int | None:
        return None if self.d.get(field) is None else self.int(field, lo, hi)

    def float(self, field: str, lo: float, hi: float, default: float) -> float:
        """A number in (lo, hi]."""
        v = self.d.get(field, default)
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

    def str(self, field: str, default: str) -> str:
        v = self.d.get(field, default)
        if v is None:
            return default
        if not isinstance(v, str):
            raise self.fail(field, f"must be a string, is {type(v).__name__}")
        return v

    def floats(self, field: str, n: int, lo: float, hi: float) -> tuple[float, ...]:
        """A list of exactly `n` numbers in (lo, hi]."""
        v = self.d.get(field)
        if not isinstance(v, list) or len(v) != n:
            raise self.fail(field, f"must be a list of {n} numbers")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (
                    math.isfinite(x) and lo < x <= hi):
                raise self.fail(field, f"holds {x!r}, not a number in ({lo}, {hi}]")
        return tuple(float(x) for x in v)

    def one_of(self, field: str, allowed: tuple[str, ...], default: str) -> str:
        v = self.str(field, default)
        if v not in allowed:
            raise self.fail(field, f"{v!r} is not implemented (Orion has "
                            f"{', '.join(allowed)})")
        return v

    def refuse_unless(self, field: str, *harmless: Any) -> None:
        """Refuses `field` unless it is absent, null or one of `harmless`: a setting that
        changes the math in a way Orion does not implement is never loaded silently."""
        v = self.d.get(field)
        if v is not None and v not in harmless:
            raise self.fail(field, f"= {v!r} changes the model in a way Orion does not "
                            "implement")


# ---- the fields most Hugging Face decoder configs share -----------------------------


def transformer_fields(c: ConfigReader, *, eps_field: str = "rms_norm_eps",
                       default_eps: float = 1e-6, tie_default: bool = False) -> dict[str, Any]:
    """The `TransformerArgs` fields under their usual config.json names."""
    dim = c.int("hidden_size", 1, MAX_WIDTH)
    heads = c.int("num_attention_heads", 1, MAX_HEADS)
    kv_heads = c.int("num_key_value_heads", 1, heads, heads)
    if heads % kv_heads:
        raise c.fail("num_key_value_heads", f"{kv_heads} does not divide "
                     f"num_attention_heads {heads}")
    head_dim = c.optional_int("head_dim", 2, MAX_HEAD_DIM)
    if head_dim is None:
        if dim % heads:
            raise c.fail("hidden_size", f"{dim} is not a multiple of num_attention_heads "
                         f"{heads}")
        head_dim = dim // heads
    return dict(dim=dim, n_layers=c.int("num_hidden_layers", 1, MAX_LAYERS), n_heads=heads,
                n_kv_heads=kv_heads, head_dim=head_dim,
                vocab_size=c.int("vocab_size", 1, MAX_VOCAB),
                hidden_dim=c.int("intermediate_size", 1, MAX_HIDDEN),
                max_positions=c.int("max_position_embeddings", 1, MAX_POSITIONS, 2048),
                norm_eps=c.float(eps_field, 0.0, 1.0, default_eps),
                tie_embeddings=c.bool("tie_word_embeddings", tie_default))


def transformer_config(a: TransformerArgs) -> dict[str, Any]:
    """`transformer_fields`' inverse: the fields under their config.json names."""
    return {"hidden_size": a.dim, "intermediate_size": a.hidden_dim,
            "num_hidden_layers": a.n_layers, "num_attention_heads": a.n_heads,
            "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim,
            "vocab_size": a.vocab_size, "max_position_embeddings": a.max_positions,
            "rms_norm_eps": a.norm_eps, "tie_word_embeddings": a.tie_embeddings}


def layer_windows(c: ConfigReader, n_layers: int, window: int) -> tuple[int, ...]:
    """Each layer's attention window from `layer_types` ("full_attention" -> 0,
    "sliding_attention" -> `window`); every layer full when the config has none."""
    types = c.d.get("layer_types")
    if types is None:
        return (0,) * n_layers
    if not isinstance(types, list) or len(types) != n_layers or any(
            t not in ("full_attention", "sliding_attention") for t in types):
        raise c.fail("layer_types", f"must list {n_layers} of full_attention / "
                     "sliding_attention")
    if "sliding_attention" in types and window <= 0:
        raise c.fail("sliding_window", "is needed by the sliding_attention layers")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


ROPE_KINDS = ("default", "linear", "llama3", "longrope")


def rope_settings(c: ConfigReader, head_dim: int, *, max_positions: int,
                  kinds: tuple[str, ...] = ("default", "linear", "llama3"),
                  theta_default: float = 10000.0) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from the classic fields (rope_theta, rope_scaling) or
    transformers 5's `rope_parameters`."""
    params = c.sub("rope_parameters")
    scaling = c.sub("rope_scaling")
    field = "rope_scaling"
    if params is not None:
        scaling, field = params, "rope_parameters"
    theta_reader = params if params is not None and "rope_theta" in params.d else c
    theta = theta_reader.float("rope_theta", 0.0, 1e12, theta_default)
    if scaling is None or not scaling.d:
        return theta, None
    kind = scaling.d.get("rope_type", scaling.d.get("type", "default"))
    if kind not in kinds:
        raise c.fail(f"{field}.rope_type", f"{kind!r} is not implemented here (this "
                     f"architecture has {', '.join(kinds)})")
    if scaling.d.get("partial_rotary_factor", 1.0) not in (None, 1, 1.0):
        raise c.fail(f"{field}.partial_rotary_factor", "other than 1 is not implemented")
    if kind == "default":
        return theta, None
    if kind == "longrope":
        half = head_dim // 2
        old = c.int("original_max_position_embeddings", 1, MAX_POSITIONS, max_positions)
        attention = scaling.d.get("attention_factor")
        factor = (scaling.float("factor", 0.0, 1e6, 1.0) if scaling.d.get("factor") is not None
                  else max_positions / old)
        return theta, RopeScaling(
            "longrope", factor=factor, original_max_position_embeddings=old,
            short_factor=scaling.floats("short_factor", half, 0.0, 1e6),
            long_factor=scaling.floats("long_factor", half, 0.0, 1e6),
            attention_factor=None if attention is None else scaling.float(
                "attention_factor", 0.0, 1e3, 1.0))
    factor = scaling.float("factor", 0.0, 1e6, 1.0)
    if kind == "linear":
        return theta, RopeScaling("linear", factor)
    low = scaling.float("low_freq_factor", 0.0, 1e6, 1.0)
    high = scaling.float("high_freq_factor", 0.0, 1e6, 4.0)
    if high <= low:
        raise c.fail(f"{field}.high_freq_factor", f"{high} must exceed low_freq_factor {low}")
    old = scaling.int("original_max_position_embeddings", 1, MAX_POSITIONS, 8192)
    if scaling.d.get("attention_factor") not in (None, 1, 1.0):
        raise c.fail(f"{field}.attention_factor", "other than 1 is not implemented")
    return theta, RopeScaling("llama3", factor, low, high, old)
