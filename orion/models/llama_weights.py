"""Llama-family weights under Hugging Face names, and the Hugging Face folder format
(config.json + model.safetensors, or shards) in both directions.

`open_hf` is what the inference model uses: the validated config and the folder's
tensors memory-mapped (`LazyWeights`), every name, shape and value checked before
anything is allocated. `load_hf` gives the same as a dict of fp32 arrays (training,
conversions).

Names and layouts are those of `transformers.LlamaForCausalLM`: linear weights are
[out, in]; q and k rows are in rotate-half order (llama2.c's interleaved pairs are
permuted on the way in and out, see `orion.formats.llama2c`). A tied model has no
`lm_head.weight`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from orion.errors import ModelLoadError
from orion.files import UnsafeFileError, inside, read_json
from orion.formats.safetensors import SafetensorsFolder
from orion.models.llama_config import LlamaConfig
from orion.models.llama_hf_config import config_from_hf, hf_config

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
    d, h, kv, q = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.q_dim
    per_layer = {
        "input_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (q, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, q),
        "post_attention_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (h, d),
        "mlp.down_proj.weight": (d, h),
        "mlp.up_proj.weight": (h, d),
    }
    if cfg.qkv_bias:
        per_layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                          "self_attn.v_proj.bias": (kv,)})
    if cfg.o_bias:
        per_layer["self_attn.o_proj.bias"] = (d,)
    if cfg.qk_norm:
        per_layer.update({"self_attn.q_norm.weight": (cfg.head_dim,),
                          "self_attn.k_norm.weight": (cfg.head_dim,)})
    shapes: dict[str, tuple[int, ...]] = {EMBED: (cfg.vocab_size, d)}
    for i in range(cfg.n_layers):
        for suffix, shape in per_layer.items():
            shapes[layer_key(i, suffix)] = shape
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


class LazyWeights(Mapping[str, np.ndarray]):
    """The tensors of a checked folder by name, each converted to fp32 when asked for
    (a layer's weights while its programs are built), never all at once."""

    def __init__(self, cfg: LlamaConfig, st: SafetensorsFolder) -> None:
        self.cfg, self.st = cfg, st
        self._names = list(param_shapes(cfg))

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.st:
            raise KeyError(name)
        return self.st.fp32(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        return self.st.fp32(name, ids)

    def parameter_count(self) -> int:
        """From the headers: counting must not convert every tensor."""
        return sum(int(np.prod(self.st.shape(n))) for n in self._names if n in self.st)


def embedding_rows(weights: Mapping[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """fp32 embedding rows of `ids`, without converting the whole table of a lazy folder."""
    if isinstance(weights, LazyWeights):
        return weights.rows(EMBED, ids)
    return np.asarray(weights[EMBED][ids], np.float32)


def read_hf_config(folder: Path) -> LlamaConfig:
    path = folder / "config.json"
    try:
        raw = read_json(inside(folder, path.name))
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    return config_from_hf(raw, str(path))


def open_hf(folder: str | os.PathLike[str]) -> tuple[LlamaConfig, LazyWeights]:
    """A Hugging Face Llama-family folder, checked whole before anything is allocated:
    the config (types and bounds), every tensor's presence, dtype and shape against
    it, and every value (finite, within fp16's range)."""
    folder = Path(folder)
    cfg = read_hf_config(folder)
    st = SafetensorsFolder(folder)
    shapes = param_shapes(cfg)
    ignored = {n for n in st if n.endswith("rotary_emb.inv_freq")}
    if cfg.tie_embeddings:
        ignored.add(LM_HEAD)   # some tied checkpoints store the shared matrix twice
    missing = sorted(set(shapes) - set(st))
    extra = sorted(set(st) - set(shapes) - ignored)
    if missing or extra:
        raise ModelLoadError(f"{folder}: the weights do not match config.json "
                             f"({cfg.model_type}, {cfg.n_layers} layers): missing "
                             f"{missing[:5]}, unexpected {extra[:5]}")
    for name, shape in shapes.items():
        if st.shape(name) != shape:
            raise ModelLoadError(f"{st.tensors[name].file}: tensor {name} has shape "
                                 f"{list(st.shape(name))}, config.json implies {list(shape)}")
        st.check_range(name)
    return cfg, LazyWeights(cfg, st)


def load_hf(folder: str | os.PathLike[str]) -> tuple[LlamaConfig, Weights]:
    """A Hugging Face Llama folder as fp32 arrays (see `open_hf` for the checks)."""
    cfg, lazy = open_hf(folder)
    return cfg, {name: lazy[name] for name in lazy}


def save_hf(folder: str | os.PathLike[str], cfg: LlamaConfig, weights: Mapping[str, np.ndarray],
            dtype: str = "float32") -> None:
    """Writes config.json and model.safetensors (each atomically), the weights in `dtype`
    ("float32", "float16" or "bfloat16", rounded to nearest even)."""
    from orion.atomic import atomic_write_bytes
    from orion.formats.safetensors import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    checked = check_weights(weights, cfg, "save_hf")
    data = save(checked, dtype, metadata={"format": "pt"})
    atomic_write_bytes(folder / "model.safetensors", data)
    cfg_json = dict(hf_config(cfg), torch_dtype=dtype)
    atomic_write_bytes(folder / "config.json", (json.dumps(cfg_json, indent=2) + "\n").encode())
