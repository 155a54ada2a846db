"""Llama weights as a flat dict of fp32 arrays under Hugging Face names, and the
Hugging Face folder format (config.json + model.safetensors) in both directions.

Names and layouts are those of `transformers.LlamaForCausalLM`: linear weights are
[out, in]; q and k rows are in rotate-half order (llama2.c's interleaved pairs are
permuted on the way in and out, see `orion.models.llama2c`). A tied model has no
`lm_head.weight`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from orion.models.base import ModelLoadError
from orion.models.llama_config import LlamaConfig

Weights = dict[str, np.ndarray]

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
# per-layer suffixes, in llama2.c's order of kinds
LAYER_KEYS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",   # w1
    "mlp.down_proj.weight",   # w2
    "mlp.up_proj.weight",     # w3
)


def layer_key(i: int, suffix: str) -> str:
    return f"model.layers.{i}.{suffix}"


def param_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a fixed order."""
    d, h, kv = cfg.dim, cfg.hidden_dim, cfg.kv_dim
    per_layer = {
        "input_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (d, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, d),
        "post_attention_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (h, d),
        "mlp.down_proj.weight": (d, h),
        "mlp.up_proj.weight": (h, d),
    }
    shapes: dict[str, tuple[int, ...]] = {EMBED: (cfg.vocab_size, d)}
    for i in range(cfg.n_layers):
        for suffix in LAYER_KEYS:
            shapes[layer_key(i, suffix)] = per_layer[suffix]
    shapes[FINAL_NORM] = (d,)
    if not cfg.tie_embeddings:
        shapes[LM_HEAD] = (cfg.vocab_size, d)
    return shapes


def classifier(weights: Mapping[str, np.ndarray], cfg: LlamaConfig) -> np.ndarray:
    return weights[EMBED] if cfg.tie_embeddings else weights[LM_HEAD]


def init_weights(cfg: LlamaConfig, seed: int = 0) -> Weights:
    """llama2.c's initialization: N(0, 0.02) for matrices, N(0, 0.02/sqrt(2 L)) for the
    residual projections (o_proj, down_proj), ones for the norms."""
    rng = np.random.default_rng(seed)
    out: Weights = {}
    small = 0.02 / np.sqrt(2 * cfg.n_layers)
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
        else:
            std = small if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def check_weights(weights: Mapping[str, np.ndarray], cfg: LlamaConfig, where: str) -> Weights:
    """The weights as fp32, after checking every name and shape against the config."""
    shapes = param_shapes(cfg)
    missing = sorted(set(shapes) - set(weights))
    extra = sorted(set(weights) - set(shapes))
    if missing or extra:
        raise ModelLoadError(f"{where}: missing tensors {missing[:5]}, unexpected {extra[:5]}")
    out: Weights = {}
    for name, shape in shapes.items():
        arr = np.asarray(weights[name])
        if arr.shape != shape:
            raise ModelLoadError(f"{where}: {name} has shape {arr.shape}, expected {shape}")
        out[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return out


# ---- Hugging Face folders ------------------------------------------------------


def hf_config(cfg: LlamaConfig) -> dict[str, object]:
    """config.json for `transformers.LlamaConfig` (and for `orion.load`)."""
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


def config_from_hf(d: Mapping[str, object], where: str = "config.json") -> LlamaConfig:
    try:
        heads = int(d["num_attention_heads"])  # type: ignore[arg-type]
        dim = int(d["hidden_size"])  # type: ignore[arg-type]
        if d.get("head_dim") not in (None, dim // heads):
            raise ModelLoadError(f"{where}: head_dim {d['head_dim']} != hidden_size / heads")
        if d.get("rope_scaling"):
            raise ModelLoadError(f"{where}: rope_scaling is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ModelLoadError(f"{where}: hidden_act {d['hidden_act']} is not silu")
        return LlamaConfig(
            dim=dim,
            n_layers=int(d["num_hidden_layers"]),  # type: ignore[arg-type]
            n_heads=heads,
            n_kv_heads=int(d.get("num_key_value_heads") or heads),  # type: ignore[arg-type]
            vocab_size=int(d["vocab_size"]),  # type: ignore[arg-type]
            hidden_dim=int(d["intermediate_size"]),  # type: ignore[arg-type]
            max_seq_len=int(d.get("max_position_embeddings", 2048)),  # type: ignore[arg-type]
            norm_eps=float(d.get("rms_norm_eps", 1e-5)),  # type: ignore[arg-type]
            rope_theta=float(d.get("rope_theta", 10000.0)),  # type: ignore[arg-type]
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(f"{where}: not a Llama config: {exc}") from exc


def load_hf(folder: str | os.PathLike[str]) -> tuple[LlamaConfig, Weights]:
    """A Hugging Face Llama folder: config.json and model.safetensors (or the shards a
    model.safetensors.index.json names)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    try:
        cfg = config_from_hf(json.loads(cfg_path.read_text(encoding="utf-8")), str(cfg_path))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{cfg_path}: {exc}") from exc
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
    else:  # model.safetensors or model-0000x-of-0000y.safetensors, not a training checkpoint
        files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no .safetensors files")
    tensors: Weights = {}
    for f in files:
        tensors.update(load_file(str(f)))
    tensors.pop("model.rotary_emb.inv_freq", None)
    for name in [k for k in tensors if k.endswith("rotary_emb.inv_freq")]:
        tensors.pop(name)
    if cfg.tie_embeddings:
        tensors.pop(LM_HEAD, None)
    return cfg, check_weights(tensors, cfg, str(folder))


def save_hf(folder: str | os.PathLike[str], cfg: LlamaConfig, weights: Mapping[str, np.ndarray],
            dtype: type[np.floating] = np.float32) -> None:
    """Writes config.json and model.safetensors (each atomically)."""
    from safetensors.numpy import save

    from orion.train.atomic import atomic_write_bytes

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    checked = check_weights(weights, cfg, "save_hf")
    data = save({k: v.astype(dtype) for k, v in checked.items()}, metadata={"format": "pt"})
    atomic_write_bytes(folder / "model.safetensors", data)
    cfg_json = dict(hf_config(cfg), torch_dtype=np.dtype(dtype).name)
    atomic_write_bytes(folder / "config.json", (json.dumps(cfg_json, indent=2) + "\n").encode())
