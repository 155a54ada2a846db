"""Token data: a corpus tokenized once into a memory-mapped uint16/uint32 file, then
random windows sampled from it.

`tokenize_file` writes `<out>.tokens` (raw little-endian ids) and `<out>.tokens.json`
(dtype, count, the tokenizer's id and the split point); `TokenData` maps the file and
`Batches` draws (inputs, targets) pairs with a numpy Generator whose state is the data
position a checkpoint saves. With `world` data-parallel ranks every rank draws every
rank's windows and keeps those of its `rank`: the shards are disjoint, the Generator
stays the same on every rank, and its state is a position any world size resumes from.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.models.base import Tokenizer
from orion.train.atomic import atomic_write_bytes


def _meta_path(tokens_path: Path) -> Path:
    return tokens_path.with_name(tokens_path.name + ".json")


def tokenize_file(text_path: str | os.PathLike[str], tokenizer: Tokenizer,
                  out_path: str | os.PathLike[str], bos_id: int | None = None,
                  chunk_lines: int = 2000) -> Path:
    """Tokenizes a UTF-8 text file (paragraph-wise, each prefixed with BOS when given)
    into a token file. Reuses an existing file made from the same text and tokenizer."""
    text_path, out_path = Path(text_path), Path(out_path)
    digest = hashlib.sha256(text_path.read_bytes()).hexdigest()
    meta_path = _meta_path(out_path)
    tok_id = getattr(tokenizer, "identity", type(tokenizer).__name__)
    if out_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("source_sha256") == digest and meta.get("tokenizer") == tok_id:
            return out_path
    dtype = np.uint16 if tokenizer.vocab_size <= 65535 else np.uint32
    lines = text_path.read_text(encoding="utf-8").splitlines(keepends=True)
    pieces = []
    for i in range(0, len(lines), chunk_lines):
        chunk = "".join(lines[i:i + chunk_lines])
        ids = tokenizer.encode(chunk)
        if bos_id is not None:
            ids = [bos_id, *ids]
        pieces.append(np.asarray(ids, dtype))
    ids_all = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
    atomic_write_bytes(out_path, ids_all.tobytes())
    meta = {"dtype": np.dtype(dtype).name, "count": int(ids_all.size), "tokenizer": tok_id,
            "vocab_size": tokenizer.vocab_size, "source": text_path.name,
            "source_sha256": digest}
    atomic_write_bytes(meta_path, json.dumps(meta, indent=1).encode())
    return out_path


class TokenData:
    """A token file, memory-mapped; `train` and `val` are views split at `val_fraction`
    from the end."""

    def __init__(self, path: str | os.PathLike[str], val_fraction: float = 0.1) -> None:
        self.path = Path(path)
        meta = json.loads(_meta_path(self.path).read_text())
        self.meta: dict[str, Any] = meta
        self.tokens = np.memmap(self.path, dtype=np.dtype(meta["dtype"]), mode="r",
                                shape=(int(meta["count"]),))
        cut = int(len(self.tokens) * (1.0 - val_fraction))
        self.train, self.val = self.tokens[:cut], self.tokens[cut:]


@dataclass
class Batches:
    """Random windows of seq+1 tokens from `tokens`; state is the Generator's."""

    tokens: np.ndarray
    batch: int
    seq: int
    seed: int = 0
    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        if len(self.tokens) <= self.seq + 1:
            raise ValueError(f"{len(self.tokens)} tokens are too few for windows of "
                             f"{self.seq + 1}")
        self.rng = np.random.default_rng(self.seed)
        self.drawn = 0

    def _starts(self) -> np.ndarray:
        """This rank's window starts of the next `world` micro-batches."""
        draws = [self.rng.integers(0, len(self.tokens) - self.seq - 1, self.batch)
                 for _ in range(self.world)]
        self.drawn += self.world
        return draws[self.rank]

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self._starts()
        win = np.stack([np.asarray(self.tokens[s:s + self.seq + 1], np.int64) for s in starts])
        return win[:, :-1], win[:, 1:]

    def skip(self, n: int) -> None:
        """Moves past n micro-batches without reading them (a step cut short still
        consumes its global batch, so every rank stays at the same position)."""
        for _ in range(n):
            self._starts()

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "drawn": self.drawn}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.rng.bit_generator.state = d["rng"]
        self.drawn = int(d["drawn"])
