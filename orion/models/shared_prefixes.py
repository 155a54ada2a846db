"""Prompt prefixes shared across the slots of a batch: the keys and values of a
prompt's first tokens up to one of its chunk cuts (`orion.models.batch`: the first
`chunk` tokens, then every 32), kept so that a later prompt starting with the same
tokens loads them instead of running those chunks again.

A chunk's rows depend only on the rows before it and on its own tokens, and the cuts
fall at the same places in every prompt, so a prompt that loads a saved prefix ends
with the very bits it gets without one: what the server did before changes how fast
an answer comes, never what it is. Memory is bounded by `max_bytes`; the least
recently used prefixes go first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from orion.errors import InvalidArgumentError

Rows = list[tuple[np.ndarray, np.ndarray]]   # per layer (k, v) [KV, n, hd]


def chunk_cuts(length: int, chunk: int, step: int) -> list[int]:
    """Where a prompt of `length` tokens is cut (positions before which a chunk ends),
    short of its end: chunk, chunk + step, ... < length."""
    return list(range(chunk, length, step)) if length > chunk else []


class SharedPrefixes:
    """Saved prefixes, most recently used last (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidArgumentError(f"max_bytes must be a non-negative integer, got "
                                       f"{max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], Rows] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.tokens_reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, ids: Sequence[int], cuts: Sequence[int]) -> tuple[int, Rows] | None:
        """The longest cut of `cuts` whose prefix of `ids` a saved entry holds, and
        that entry's rows (longer than the cut: slice them); None when none does."""
        if not cuts or not self._entries:
            return None
        want = np.asarray(ids[: cuts[-1]], np.int64)
        best: tuple[int, tuple[int, ...]] | None = None
        for key in self._entries:
            n = min(len(key), len(want))
            if n < cuts[0]:
                continue
            same = np.asarray(key[:n], np.int64) == want[:n]
            common = n if same.all() else int(np.argmin(same))
            cut = max((c for c in cuts if c <= common), default=0)
            if cut and (best is None or cut > best[0]):
                best = (cut, key)
        if best is None:
            return None
        cut, key = best
        self._entries.move_to_end(key)
        self.hits += 1
        self.tokens_reused += cut
        return cut, self._entries[key]

    def save(self, ids: Sequence[int], rows: Callable[[], Rows]) -> None:
        """Keeps `rows()` (copies the caller makes only when they will be kept) as the
        prefix `ids`, dropping the least recently used entries to stay in bounds."""
        key = tuple(int(i) for i in ids)
        if not key or key in self._entries:
            if key in self._entries:
                self._entries.move_to_end(key)
            return
        saved = rows()
        size = sum(k.nbytes + v.nbytes for k, v in saved)
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= sum(k.nbytes + v.nbytes for k, v in old)
        self._entries[key] = saved
        self.bytes += size

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
