"""The training configuration: one dataclass, read from a JSON file (`orion train
--config`). `model` is a preset name (`PRESETS`, llama2.c's TinyStories shapes), a
config.json object of any architecture Orion reads (it has a "model_type"), or an object
of Orion's Llama fields (dim, n_layers, n_heads, n_kv_heads, hidden_dim, max_seq_len,
norm_eps, rope_theta, tie_embeddings); its vocab_size is taken from the tokenizer.

`TrainConfig.validate` is the one validator of this type: every field's type and
range, checked before anything is allocated or trained (a NaN learning rate, zero
accumulation steps or an unknown export dtype used to train, or finish with a NaN
loss and exit 0). Errors are `ConfigError`s naming the file and the field.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from orion.errors import ConfigError, ModelLoadError
from orion.files import read_json
from orion.models.architecture import Architecture

EXPORT_DTYPES = ("float16", "float32")
UPDATES = ("delta", "inputs")
MAX_PARAMS = 1 << 34          # 16G parameters: past this, init would exhaust memory
MAX_SIZE = 1 << 24            # bound on batch, sequence, vocabulary, steps and such

# field -> (kind, low, high); kind "int" or "float", bounds inclusive, None: unbounded
_RANGES: dict[str, tuple[str, float, float | None]] = {
    "vocab_size": ("int", 4, MAX_SIZE), "batch_size": ("int", 1, MAX_SIZE),
    "seq_len": ("int", 1, MAX_SIZE), "grad_accum": ("int", 1, MAX_SIZE),
    "steps": ("int", 0, None), "warmup": ("int", 0, None),
    "checkpoint_every": ("int", 0, None), "log_every": ("int", 1, None),
    "seed": ("int", 0, (1 << 63) - 1),
    "lr": ("float", 0.0, None), "min_lr": ("float", 0.0, None),
    "weight_decay": ("float", 0.0, None), "beta1": ("float", 0.0, 1.0 - 1e-9),
    "beta2": ("float", 0.0, 1.0 - 1e-9), "grad_clip": ("float", 0.0, None),
    "loss_scale": ("float", 1.0, 2.0 ** 24), "val_fraction": ("float", 0.0, 0.9),
}
_MODEL_INTS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim",
               "max_seq_len")
_MODEL_FLOATS = ("norm_eps", "rope_theta")
# Orion's Llama fields, their defaults (llama2.c's stories15M) and config.json names
LLAMA_FIELDS: dict[str, tuple[Any, str]] = {
    "dim": (288, "hidden_size"), "n_layers": (6, "num_hidden_layers"),
    "n_heads": (6, "num_attention_heads"), "n_kv_heads": (None, "num_key_value_heads"),
    "vocab_size": (32000, "vocab_size"), "hidden_dim": (768, "intermediate_size"),
    "max_seq_len": (256, "max_position_embeddings"), "norm_eps": (1e-5, "rms_norm_eps"),
    "rope_theta": (10000.0, "rope_theta"), "tie_embeddings": (True, "tie_word_embeddings"),
}
# llama2.c's TinyStories models
PRESETS: dict[str, dict[str, Any]] = {
    "stories15M": {"dim": 288, "n_layers": 6, "n_heads": 6, "hidden_dim": 768,
                   "max_seq_len": 256},
    "stories42M": {"dim": 512, "n_layers": 8, "n_heads": 8, "hidden_dim": 1376,
                   "max_seq_len": 1024},
    "stories110M": {"dim": 768, "n_layers": 12, "n_heads": 12, "hidden_dim": 2048,
                    "max_seq_len": 1024},
}


def llama_config(fields: dict[str, Any]) -> dict[str, Any]:
    """Orion's Llama fields as a Llama config.json."""
    d = {k: fields.get(k, default) for k, (default, _) in LLAMA_FIELDS.items()}
    if d["n_kv_heads"] is None:
        d["n_kv_heads"] = d["n_heads"]
    out: dict[str, Any] = {"model_type": "llama", "hidden_act": "silu"}
    out.update({LLAMA_FIELDS[k][1]: v for k, v in d.items()})
    return out


def architecture_of(spec: Any, where: str) -> Architecture:
    """The model a training config's (or a checkpoint's) `model` describes: a
    config.json object (with "model_type") or Orion's Llama fields."""
    from orion.models.registry import architecture_from_config

    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: model must be an object, got {type(spec).__name__}")
    config = spec if "model_type" in spec else llama_config(spec)
    try:
        return architecture_from_config(dict(config), where)
    except (ModelLoadError, ValueError, TypeError, OverflowError) as exc:
        raise ConfigError(f"{where}: model: {exc}") from None


def _check_number(where: str, name: str, value: Any, kind: str, low: float,
                  high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or (kind == "int" and not isinstance(value, int)):
        want = "an integer" if kind == "int" else "a number"
        raise ConfigError(f"{where}: {name} must be {want}, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {name} must be finite, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{where}: {name} must be {bound}, got {value!r}")


@dataclass
class TrainConfig:
    model: dict[str, Any] | str = field(default_factory=dict)
    tokenizer: str = "train"         # a SentencePiece .model path, or "train"
    vocab_size: int = 512            # of a tokenizer trained on the corpus
    batch_size: int = 4              # sequences per micro-batch
    seq_len: int = 64
    grad_accum: int = 1              # micro-batches per optimizer step
    steps: int = 1000                # optimizer steps in the whole run
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    update: str | None = None        # "delta" or "inputs"; None: inputs on ane, else delta
    backend: str | None = None       # None: the best available (ane, else vane)
    loss_scale: float = 1024.0
    dynamic_loss_scale: bool = True
    checkpoint_every: int = 100
    log_every: int = 1
    seed: int = 0
    val_fraction: float = 0.1        # of the corpus (its end) held out from training
    val_every: int = 100             # validation loss every this many steps (0: only at the end)
    val_batches: int = 4             # micro-batches of fixed held-out windows per validation
    export_dtype: str = "float16"    # of the model.safetensors beside the checkpoint
    # host BLAS threads (threadpoolctl); None: 1 for models under dim 512, whose host
    # matmuls are too small to pay for a thread hand-off, else the BLAS default
    blas_threads: int | None = None
    # data-parallel runs (mlx.launch, docs/distributed.md): batch_size is per rank; the
    # gradient all-reduce's wire dtype ("float32", "bfloat16", "float16"), and how long
    # any collective waits for the other ranks before this rank gives up
    reduce_dtype: str = "float32"
    collective_timeout_s: float = 600.0

    @classmethod
    def from_dict(cls, d: Any, source: str = "training config") -> TrainConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"{source}: unknown training config keys: {sorted(unknown)}")
        config = cls(**d)
        config.validate(source)
        return config

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TrainConfig:
        return cls.from_dict(read_json(path), os.fspath(path))

    def validate(self, where: str = "training config") -> None:
        """Refuses a field of the wrong type or out of range (see the module docstring)."""
        for name, (kind, low, high) in _RANGES.items():
            _check_number(where, name, getattr(self, name), kind, low, high)
        if self.min_lr > self.lr:
            raise ConfigError(f"{where}: min_lr {self.min_lr} is above lr {self.lr}")
        if self.export_dtype not in EXPORT_DTYPES:
            raise ConfigError(f"{where}: export_dtype must be one of {', '.join(EXPORT_DTYPES)}, "
                              f"got {self.export_dtype!r}")
        if self.update is not None and self.update not in UPDATES:
            raise ConfigError(f"{where}: update must be one of {', '.join(UPDATES)}, "
                              f"got {self.update!r}")
        for name in ("dynamic_loss_scale",):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{where}: {name} must be true or false")
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise ConfigError(f"{where}: tokenizer must be \"train\" or a .model path")
        if self.backend is not None and not isinstance(self.backend, str):
            raise ConfigError(f"{where}: backend must be a name or null, got {self.backend!r}")
        if self.blas_threads is not None:
            _check_number(where, "blas_threads", self.blas_threads, "int", 1, 1024)
        self.model_config(self.vocab_size if self.tokenizer == "train" else 32, where)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def model_config(self, vocab_size: int, where: str = "training config") -> Architecture:
        """The model to train, its vocabulary the tokenizer's."""
        if isinstance(self.model, str):
            if self.model not in PRESETS:
                raise ConfigError(f"{where}: model: unknown preset {self.model!r}; known: "
                                  f"{sorted(PRESETS)}")
            d: dict[str, Any] = dict(PRESETS[self.model])
        elif isinstance(self.model, dict):
            d = dict(self.model)
        else:
            raise ConfigError(f"{where}: model must be a preset name or an object of "
                              f"model fields, got {type(self.model).__name__}")
        if "model_type" in d:
            d["vocab_size"] = vocab_size
            d.setdefault("max_position_embeddings", max(self.seq_len, 1))
        else:
            unknown = set(d) - set(LLAMA_FIELDS)
            if unknown:
                raise ConfigError(f"{where}: model: unknown Llama fields {sorted(unknown)} "
                                  "(or give a config.json object with a model_type)")
            d["vocab_size"] = vocab_size
            d.setdefault("max_seq_len", max(self.seq_len, 1))
            for name in _MODEL_INTS:
                if name in d:
                    _check_number(where, f"model.{name}", d[name], "int", 1, MAX_SIZE)
            for name in _MODEL_FLOATS:
                if name in d:
                    _check_number(where, f"model.{name}", d[name], "float", 0.0, None)
            if "tie_embeddings" in d and not isinstance(d["tie_embeddings"], bool):
                raise ConfigError(f"{where}: model.tie_embeddings must be true or false")
        arch = architecture_of(d, where)
        n = sum(int(np.prod(s)) for s in arch.parameters().values())
        if n > MAX_PARAMS:
            raise ConfigError(f"{where}: model: {n:.3g} parameters, more than the "
                              f"{MAX_PARAMS:.3g} Orion trains")
        return arch
