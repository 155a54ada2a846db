"""Builders for the hostile-input tests: small model folders written with numpy and
safetensors (no torch), FIFOs with a watchdog that turns a hang into a failure, and a
tiny training set-up."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

GPT2_TINY = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2,
             "n_positions": 64, "vocab_size": 50257}


def write_gpt2_folder(folder: Path, config: dict[str, Any] | None = None,
                      tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A GPT-2 folder: config.json and model.safetensors with random weights of the
    shapes the (valid) config implies, or `tensors` as given."""
    from safetensors.numpy import save_file

    from orion.models.architectures.gpt2 import Model

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**GPT2_TINY, **(config or {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    if tensors is None:
        arch = Model.from_config({**GPT2_TINY}, "GPT2_TINY")
        shapes = {k: s[::-1] if arch.stored_transposed(k) else s
                  for k, s in arch.parameters().items()}
        rng = np.random.default_rng(0)
        tensors = {k: (0.02 * rng.standard_normal(s)).astype(np.float32)
                   for k, s in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


class HangWatch:
    """Fails instead of hanging: after `seconds`, opens the FIFO for writing (which
    releases a reader blocked in open or read) and records that it had to."""

    def __init__(self, fifo: Path, seconds: float = 5.0) -> None:
        self.fifo, self.hung = fifo, False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(seconds,), daemon=True)

    def _watch(self, seconds: float) -> None:
        if self._done.wait(seconds):
            return
        self.hung = True
        while not self._done.is_set():
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            time.sleep(0.05)

    def __enter__(self) -> HangWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        assert not self.hung, f"reading {self.fifo} blocked: a FIFO must be refused, not read"


@contextmanager
def fifo_at(path: Path, seconds: float = 5.0):
    """A FIFO at `path`, watched (see HangWatch)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    with HangWatch(path, seconds) as watch:
        yield watch


def corpus() -> Path:
    """Tiny Shakespeare, shipped in tests/data (one lookup: tests/asset_paths.py)."""
    from asset_paths import require_asset

    return require_asset("text/tinyshakespeare_input.txt")


def tiny_train_config(**kw: Any):
    """A tiny Llama on the numpy reference backend: a step takes milliseconds."""
    from orion.train.config import TrainConfig

    base = dict(model={"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64},
                tokenizer="train", vocab_size=384, batch_size=2, seq_len=16, steps=12,
                lr=3e-3, min_lr=3e-4, warmup=2, checkpoint_every=0, backend="reference",
                update="inputs", seed=3)
    base.update(kw)
    return TrainConfig(**base)


def small_corpus(folder: Path, nbytes: int = 60_000) -> Path:
    """The first `nbytes` of tiny Shakespeare (enough for a 384-piece vocabulary)."""
    out = folder / "corpus.txt"
    out.write_bytes(corpus().read_bytes()[:nbytes])
    return out


def copy_folder(src: Path, dst: Path) -> Path:
    """A copy of a model folder that a test may then damage."""
    shutil.copytree(src, dst)
    return dst
