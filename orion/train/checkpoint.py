"""One self-describing training checkpoint: a safetensors file whose tensors are the
fp32 master weights (Hugging Face names) and AdamW moments (`optim.m.*`, `optim.v.*`),
and whose header metadata holds, under "orion", a JSON document with the model config,
the training config, the step, the optimizer step count, the loss scaler, the data
sampler's RNG state, the loss history, the identities (hashes) of the tokenizer and
the data, and a SHA-256 of every tensor. Written atomically (`orion.atomic`),
so a kill -9 during a write leaves the previous checkpoint whole.

`load_checkpoint` refuses a file that is not a regular file, does not parse, carries
no Orion metadata, whose tensors do not match their checksum (a flipped bit) or hold
NaN or infinity: a resumed run never continues from, nor overwrites, a bad checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.atomic import atomic_write_bytes, clean_stale_temps
from orion.errors import ModelLoadError, OrionError
from orion.formats.safetensors import read_file, save, stored_dtypes

CHECKPOINT = "checkpoint.safetensors"
FORMAT = "orion-train-checkpoint/2"


class CheckpointError(OrionError, ValueError):
    """A checkpoint is missing, corrupt, or does not match the run it should resume."""


@dataclass
class Checkpoint:
    weights: dict[str, np.ndarray]
    optim: dict[str, np.ndarray]
    meta: dict[str, Any]


def tensors_sha256(tensors: dict[str, np.ndarray]) -> str:
    """A hash of every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        h.update(f"{name}\0{t.dtype.str}\0{list(t.shape)}\0".encode())
        h.update(memoryview(t).cast("B"))
    return h.hexdigest()


def save_checkpoint(path: str | os.PathLike[str], weights: dict[str, np.ndarray],
                    optim: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    path = Path(path)
    clean_stale_temps(path.parent)   # a killed writer's, never a live one's
    tensors = {k: np.ascontiguousarray(v, np.float32) for k, v in {**weights, **optim}.items()}
    doc = json.dumps({"format": FORMAT, **meta, "tensors_sha256": tensors_sha256(tensors)},
                     sort_keys=True)
    atomic_write_bytes(path, save(tensors, "float32", metadata={"orion": doc}))


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    try:
        if any(d != "F32" for d in stored_dtypes(path).values()):
            raise CheckpointError(f"{path}: a checkpoint holds fp32 tensors only")
        tensors, header = read_file(path, fp16_range=False)
    except ModelLoadError as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file "
                              f"({type(exc).__name__})") from None
    meta_text = header.get("orion")
    if meta_text is None:
        raise CheckpointError(f"{path}: not an Orion training checkpoint (no metadata)")
    try:
        meta = json.loads(meta_text)
    except (json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{path}: its Orion metadata is not valid JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(f"{path}: checkpoint format {found!r}, expected {FORMAT!r}")
    if tensors_sha256(tensors) != meta.get("tensors_sha256"):
        raise CheckpointError(f"{path}: tensors do not match their checksum (the file was "
                              "changed or corrupted after it was written)")
    for name, t in tensors.items():
        if t.dtype != np.float32 or not np.isfinite(t).all():
            raise CheckpointError(f"{path}: tensor {name} is not finite fp32")
    weights = {k: v for k, v in tensors.items() if not k.startswith("optim.")}
    optim = {k: v for k, v in tensors.items() if k.startswith("optim.")}
    return Checkpoint(weights, optim, meta)


def checkpoint_exists(folder: Path) -> bool:
    return os.path.lexists(folder / CHECKPOINT)
