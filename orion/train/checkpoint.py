"""One self-describing training checkpoint: a safetensors file whose tensors are the
fp32 master weights (Hugging Face names) and AdamW moments (`optim.m.*`, `optim.v.*`),
and whose header metadata holds, under "orion", a JSON document with the model config,
the training config, the step, the optimizer step count, the loss scaler, the data
sampler's RNG state and the loss history. Written atomically (`orion.train.atomic`),
so a kill -9 during a write leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.train.atomic import atomic_write_bytes

CHECKPOINT = "checkpoint.safetensors"
FORMAT = "orion-train-checkpoint/1"


@dataclass
class Checkpoint:
    weights: dict[str, np.ndarray]
    optim: dict[str, np.ndarray]
    meta: dict[str, Any]


def save_checkpoint(path: str | os.PathLike[str], weights: dict[str, np.ndarray],
                    optim: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    from safetensors.numpy import save

    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed writer
        stale.unlink(missing_ok=True)
    tensors = {**weights, **optim}
    doc = json.dumps({"format": FORMAT, **meta}, sort_keys=True)
    data = save({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
                metadata={"orion": doc})
    atomic_write_bytes(path, data)


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="numpy") as f:
        meta_text = (f.metadata() or {}).get("orion")
        if meta_text is None:
            raise ValueError(f"{path}: not an Orion training checkpoint (no metadata)")
        meta = json.loads(meta_text)
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}, "
                             f"expected {FORMAT!r}")
        weights, optim = {}, {}
        for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            (optim if k.startswith("optim.") else weights)[k] = f.get_tensor(k)
    return Checkpoint(weights, optim, meta)
