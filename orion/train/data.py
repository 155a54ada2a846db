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

import codecs
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.atomic import atomic_write_bytes
from orion.errors import DataError
from orion.files import MAX_TEXT_BYTES, UnsafeFileError, read_bytes, read_json
from orion.tokenizers.base import Tokenizer

CHUNK_BYTES = 4 << 20    # text handed to the tokenizer at once, at most


def _check_utf8(data: bytes, text_path: Path) -> None:
    """Refuses bytes that are not UTF-8, a chunk at a time (decoding a 2 GB corpus
    whole made a second copy of it, up to 4x its size)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    for start in range(0, len(data), CHUNK_BYTES):
        held = len(decoder.getstate()[0])
        try:
            decoder.decode(data[start:start + CHUNK_BYTES], final=False)
        except UnicodeDecodeError as exc:
            raise DataError(f"training data {text_path}: not UTF-8 text (bad byte at "
                            f"offset {start - held + exc.start})") from None
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"training data {text_path}: not UTF-8 text (it ends inside a "
                        "character)") from None


def read_corpus(text_path: Path) -> tuple[bytes, str]:
    """The corpus's bytes and their SHA-256 (the data's identity in a checkpoint):
    a regular UTF-8 file of bounded size, else a DataError naming it."""
    try:
        data = read_bytes(text_path, max_bytes=MAX_TEXT_BYTES)
    except UnsafeFileError as exc:
        raise DataError(f"training data {exc}") from None
    _check_utf8(data, text_path)
    if not data.strip():
        raise DataError(f"training data {text_path}: empty")
    return data, hashlib.sha256(data).hexdigest()


def _meta_path(tokens_path: Path) -> Path:
    return tokens_path.with_name(tokens_path.name + ".json")


def tokenize_file(text_path: str | os.PathLike[str], tokenizer: Tokenizer,
                  out_path: str | os.PathLike[str], bos_id: int | None = None,
                  chunk_lines: int = 2000) -> Path:
    """Tokenizes a UTF-8 text file (paragraph-wise, each prefixed with BOS when given)
    into a token file. Reuses an existing file made from the same text and tokenizer."""
    text_path, out_path = Path(text_path), Path(out_path)
    data, digest = read_corpus(text_path)
    meta_path = _meta_path(out_path)
    tok_id = tokenizer.identity
    if out_path.is_file() and meta_path.is_file():
        try:
            meta = read_json(meta_path)
        except UnsafeFileError:
            meta = {}          # ours, but damaged: tokenize again
        if isinstance(meta, dict) and meta.get("source_sha256") == digest \
                and meta.get("tokenizer") == tok_id:
            return out_path
    dtype = np.uint16 if tokenizer.vocab_size <= 65535 else np.uint32
    pieces = []
    for chunk in text_chunks(data, chunk_lines):
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


def text_chunks(data: bytes, lines: int) -> Iterator[str]:
    """UTF-8 `data` as text pieces of up to `lines` lines (split at "\n") and at most
    CHUNK_BYTES: the tokenizer never gets a whole 2 GB single-line file at once. A
    line longer than that is cut before a space where there is one in it, else at a
    character boundary."""
    start, size = 0, len(data)
    while start < size:
        limit = min(size, start + CHUNK_BYTES)
        end, found = start, 0
        while found < lines:
            newline = data.find(b"\n", end, limit)
            if newline < 0:
                break
            end, found = newline + 1, found + 1
        if limit == size and (found < lines or end == size):
            end = size                   # the last piece takes the unterminated tail
        elif end == start:               # one line longer than the bound: cut it
            space = data.rfind(b" ", start + 1, limit)
            end = space if space > start else limit
            while end > start + 1 and data[end] & 0xC0 == 0x80:   # inside a character
                end -= 1
        yield data[start:end].decode("utf-8")
        start = end


class TokenData:
    """A token file, memory-mapped; `train` and `val` are views split at `val_fraction`
    from the end."""

    def __init__(self, path: str | os.PathLike[str], val_fraction: float = 0.1) -> None:
        self.path = Path(path)
        meta = read_json(_meta_path(self.path))
        try:
            dtype, count = np.dtype({"uint16": np.uint16, "uint32": np.uint32}[meta["dtype"]]), \
                int(meta["count"])
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{_meta_path(self.path)}: not a token file description") from None
        if count < 0 or self.path.stat().st_size != count * dtype.itemsize:
            raise DataError(f"{self.path}: {self.path.stat().st_size} bytes, but its "
                            f"description says {count} {dtype.name} tokens")
        self.meta: dict[str, Any] = meta
        self.tokens = (np.memmap(self.path, dtype=dtype, mode="r", shape=(count,)) if count
                       else np.zeros(0, dtype))
        cut = int(len(self.tokens) * (1.0 - val_fraction))
        self.train, self.val = self.tokens[:cut], self.tokens[cut:]


def fixed_windows(tokens: np.ndarray, batch: int, seq: int,
                  count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` (inputs, targets) batches of windows spread evenly over `tokens`, the
    same every call, so validation losses of a run compare step to step. Empty when
    `tokens` holds no window of seq+1."""
    room = len(tokens) - seq - 1
    if room < 0 or count <= 0:
        return []
    starts = np.linspace(0, room, batch * count).round().astype(np.int64)
    win = np.stack([np.asarray(tokens[s:s + seq + 1], np.int64) for s in starts])
    win = win.reshape(count, batch, seq + 1)
    return [(w[:, :-1], w[:, 1:]) for w in win]


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
            raise DataError(f"the training data has {len(self.tokens)} tokens, too few for "
                            f"windows of seq_len + 1 = {self.seq + 1}")
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
