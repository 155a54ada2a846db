"""The training configuration: one dataclass, read from a JSON file (`orion train
--config`). `model` is a preset name (`orion.models.llama_config.PRESETS`) or a dict of
`LlamaConfig` fields; its vocab_size is taken from the tokenizer."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from orion.models.llama_config import PRESETS, LlamaConfig


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
    update: str = "delta"            # weight-update strategy: "delta" or "inputs"
    backend: str | None = None       # None: the best available (ane, else vane)
    loss_scale: float = 1024.0
    dynamic_loss_scale: bool = True
    checkpoint_every: int = 100
    log_every: int = 1
    seed: int = 0
    val_fraction: float = 0.1
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
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown training config keys: {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TrainConfig:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def model_config(self, vocab_size: int) -> LlamaConfig:
        base = PRESETS[self.model].to_dict() if isinstance(self.model, str) else {}
        if isinstance(self.model, str) and self.model not in PRESETS:
            raise ValueError(f"unknown model preset {self.model!r}; known: {sorted(PRESETS)}")
        d = {**base, **(self.model if isinstance(self.model, dict) else {})}
        d["vocab_size"] = vocab_size
        d.setdefault("max_seq_len", max(self.seq_len, 1))
        d.setdefault("n_kv_heads", d.get("n_heads", LlamaConfig().n_heads))
        return LlamaConfig.from_dict(d)
