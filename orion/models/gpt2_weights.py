"""GPT-2 config and weights from a Hugging Face model folder.

`config.json` + `model.safetensors`, the layout `transformers` saves. Read with the
`safetensors` library (numpy, memory-mapped): no torch, and never pickle. Every name
is mapped explicitly and every shape checked; transformers' `Conv1D` stores linear
weights as [in, out], which becomes the usual [out, in] here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from orion.files import UnsafeFileError, check_regular, inside
from orion.models.base import ModelLoadError, read_config_json

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu")
# Buffers older transformers versions saved with the weights: not parameters.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
FP16_MAX = 65504.0   # the programs run in fp16: a larger weight would be inf there

# Bounds of the config's integers, checked before anything is sized from them (a
# `n_layer` of 1e9 used to build a billion-entry shape table first).
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 22), "n_positions": (1, 1 << 20), "n_embd": (1, 1 << 16),
    "n_layer": (1, 1024), "n_head": (1, 1 << 12), "n_inner": (1, 1 << 18),
    "bos_token_id": (0, 1 << 22), "eos_token_id": (0, 1 << 22),
}


@dataclass(frozen=True)
class GPT2Config:
    """Hyper-parameters of a GPT-2 model (names as in transformers' GPT2Config)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None           # None: 4 * n_embd
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256

    @property
    def d_ff(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> GPT2Config:
        if raw.get("model_type", "gpt2") != "gpt2":
            raise ModelLoadError(f"{source}: model_type {raw.get('model_type')!r} is not gpt2")
        unsupported = {
            "scale_attn_by_inverse_layer_idx": False,
            "add_cross_attention": False,
            "scale_attn_weights": True,
        }
        for key, wanted in unsupported.items():
            if bool(raw.get(key, wanted)) != wanted:
                raise ModelLoadError(f"{source}: {key}={raw[key]!r} is not supported")
        names = {f for f in cls.__dataclass_fields__}
        known = {k: v for k, v in raw.items() if k in names}
        _check_fields(known, source)
        config = cls(**known)
        if config.activation_function not in GELU_TANH:
            raise ModelLoadError(f"{source}: activation {config.activation_function!r} is not "
                                 f"supported (one of {', '.join(GELU_TANH)})")
        if config.n_embd % config.n_head:
            raise ModelLoadError(f"{source}: n_embd {config.n_embd} is not a multiple of "
                                 f"n_head {config.n_head}")
        return config

    @classmethod
    def from_folder(cls, folder: Path) -> GPT2Config:
        return cls.from_dict(read_config_json(folder), str(folder / "config.json"))


def _check_fields(raw: dict[str, Any], source: str) -> None:
    """Types and bounds of the config fields present (null is allowed where the
    dataclass default is None: n_inner, bos/eos ids)."""
    nullable = {f.name for f in fields(GPT2Config) if f.default is None}
    for name, (low, high) in INT_BOUNDS.items():
        if name not in raw or (raw[name] is None and name in nullable):
            continue
        v = raw[name]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelLoadError(f"{source}: {name} must be an integer, got {v!r}"[:200])
        if not low <= v <= high:
            raise ModelLoadError(f"{source}: {name} {v} is outside [{low}, {high}]")
    if "layer_norm_epsilon" in raw:
        v = raw["layer_norm_epsilon"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or not 0 < v < 1:
            raise ModelLoadError(f"{source}: layer_norm_epsilon must be a number in (0, 1), "
                                 f"got {v!r}"[:200])
    for name in ("activation_function",):
        if name in raw and not isinstance(raw[name], str):
            raise ModelLoadError(f"{source}: {name} must be a string")
    if "tie_word_embeddings" in raw and not isinstance(raw["tie_word_embeddings"], bool):
        raise ModelLoadError(f"{source}: tie_word_embeddings must be true or false")


@dataclass
class GPT2Layer:
    """One transformer block, fp32, linear weights [out, in]."""

    ln1_g: np.ndarray    # (n_embd,)
    ln1_b: np.ndarray    # (n_embd,)
    w_qkv: np.ndarray    # (3 n_embd, n_embd): q, k, v stacked
    b_qkv: np.ndarray    # (3 n_embd,)
    w_proj: np.ndarray   # (n_embd, n_embd)
    b_proj: np.ndarray   # (n_embd,)
    ln2_g: np.ndarray    # (n_embd,)
    ln2_b: np.ndarray    # (n_embd,)
    w_fc: np.ndarray     # (d_ff, n_embd)
    b_fc: np.ndarray     # (d_ff,)
    w_out: np.ndarray    # (n_embd, d_ff)
    b_out: np.ndarray    # (n_embd,)


@dataclass
class GPT2Weights:
    wte: np.ndarray      # (vocab, n_embd), also the LM head when tied
    wpe: np.ndarray      # (n_positions, n_embd)
    layers: list[GPT2Layer] = field(default_factory=list)
    lnf_g: np.ndarray | None = None   # (n_embd,)
    lnf_b: np.ndarray | None = None   # (n_embd,)
    lm_head: np.ndarray | None = None  # (vocab, n_embd); None: tied to wte

    @property
    def head(self) -> np.ndarray:
        return self.wte if self.lm_head is None else self.lm_head


def expected_shapes(c: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a transformers GPT2LMHeadModel checkpoint, by its name there
    (without the "transformer." prefix), in the file's own orientation."""
    d, f = c.n_embd, c.d_ff
    shapes: dict[str, tuple[int, ...]] = {
        "wte.weight": (c.vocab_size, d),
        "wpe.weight": (c.n_positions, d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    for i in range(c.n_layer):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, f), p + "mlp.c_fc.bias": (f,),
            p + "mlp.c_proj.weight": (f, d), p + "mlp.c_proj.bias": (d,),
        })
    return shapes


def _weight_files(folder: Path) -> list[Path]:
    """The weight files, each inside the folder (links out are refused) and regular."""
    try:
        if (folder / "model.safetensors").exists() or (folder / "model.safetensors").is_symlink():
            return [check_regular(inside(folder, "model.safetensors"))]
        shards = sorted(folder.glob("model-*-of-*.safetensors"))
        if shards:
            return [check_regular(inside(folder, p.name)) for p in shards]
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
    hint = (f" (found {', '.join(pickled)}: pickle files are never loaded; re-save with "
            "save_pretrained(..., safe_serialization=True))") if pickled else ""
    raise ModelLoadError(f"{folder}: no model.safetensors{hint}")


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    """All tensors of the folder's safetensors files, as numpy arrays."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for path in _weight_files(folder):
        try:
            tensors.update(load_file(path))
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise ModelLoadError(f"{path}: not a readable safetensors file "
                                 f"({type(exc).__name__})") from None
    return tensors


def load_gpt2_weights(folder: Path, config: GPT2Config | None = None
                      ) -> tuple[GPT2Config, GPT2Weights]:
    """Config and fp32 weights of a Hugging Face GPT-2 folder; checks every name and shape."""
    config = config or GPT2Config.from_folder(folder)
    raw = read_tensors(folder)
    tensors: dict[str, np.ndarray] = {}
    lm_head = raw.pop("lm_head.weight", None)
    for name, t in raw.items():
        key = name.removeprefix("transformer.")
        if key.endswith(IGNORED_SUFFIXES):
            continue
        tensors[key] = t
    want = expected_shapes(config)
    missing = sorted(set(want) - set(tensors))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{folder}: missing tensors {', '.join(missing[:5])}{more}")
    unexpected = sorted(set(tensors) - set(want))
    if unexpected:
        raise ModelLoadError(f"{folder}: tensors that GPT-2 with this config does not have: "
                             f"{', '.join(unexpected[:5])} (a different architecture, or "
                             "config.json does not match the weights)")
    for name, shape in want.items():
        if tuple(tensors[name].shape) != shape:
            raise ModelLoadError(f"{folder}: tensor {name} has shape "
                                 f"{list(tensors[name].shape)}, expected {list(shape)}")
    for name in [*want, *(["lm_head.weight"] if lm_head is not None else [])]:
        t = lm_head if name == "lm_head.weight" else tensors[name]
        if not np.issubdtype(t.dtype, np.floating):
            raise ModelLoadError(f"{folder}: tensor {name} is {t.dtype}, not floating point")
        if not (np.isfinite(t).all() and float(np.abs(t).max(initial=0.0)) <= FP16_MAX):
            raise ModelLoadError(f"{folder}: tensor {name} holds NaN, infinity or values "
                                 f"beyond fp16's {FP16_MAX:g}")
    if lm_head is not None and tuple(lm_head.shape) != want["wte.weight"]:
        raise ModelLoadError(f"{folder}: tensor lm_head.weight has shape {list(lm_head.shape)}, "
                             f"expected {list(want['wte.weight'])}")

    def get(name: str) -> np.ndarray:
        return np.ascontiguousarray(tensors[name], dtype=np.float32)

    def linear(name: str) -> np.ndarray:  # Conv1D [in, out] -> [out, in]
        return np.ascontiguousarray(tensors[name].T, dtype=np.float32)

    if lm_head is None and not config.tie_word_embeddings:
        raise ModelLoadError(f"{folder}: missing tensor lm_head.weight "
                             "(tie_word_embeddings is false)")
    layers = []
    for i in range(config.n_layer):
        p = f"h.{i}."
        layers.append(GPT2Layer(
            ln1_g=get(p + "ln_1.weight"), ln1_b=get(p + "ln_1.bias"),
            w_qkv=linear(p + "attn.c_attn.weight"), b_qkv=get(p + "attn.c_attn.bias"),
            w_proj=linear(p + "attn.c_proj.weight"), b_proj=get(p + "attn.c_proj.bias"),
            ln2_g=get(p + "ln_2.weight"), ln2_b=get(p + "ln_2.bias"),
            w_fc=linear(p + "mlp.c_fc.weight"), b_fc=get(p + "mlp.c_fc.bias"),
            w_out=linear(p + "mlp.c_proj.weight"), b_out=get(p + "mlp.c_proj.bias"),
        ))
    head = None
    if lm_head is not None and not (config.tie_word_embeddings
                                    and np.array_equal(lm_head, tensors["wte.weight"])):
        head = np.ascontiguousarray(lm_head, dtype=np.float32)
    return config, GPT2Weights(
        wte=get("wte.weight"), wpe=get("wpe.weight"), layers=layers,
        lnf_g=get("ln_f.weight"), lnf_b=get("ln_f.bias"), lm_head=head,
    )
