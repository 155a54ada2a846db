"""The decode KV cache of a model, kept head-major in its device surfaces.

Each layer's key and value surfaces hold, from their first byte, the cache of the
decode bucket T in use as [n_kv_heads, T, head_dim] fp16: a decode program reads its
[1, T*KVD/W, 1, W] block (a prefix of the surface) as [1, KV, T, hd] by a reshape, so
both attention products read each head's keys and values contiguously and nothing
transposes the cache (`orion.models.programs`).

The same surfaces serve every bucket (ANE-C18: one size for all inputs), but a layout
for T = 256 is not one for T = 1024: head h starts at h*T*hd. So the cache remembers
which bucket it is laid out for, and `lay_out` moves the rows once (a copy per layer)
when a step needs another bucket. Every element outside the live rows stays zero: a
masked score is q.k + MASK_VALUE, which a stale key of any size could undo. Given the
surfaces, the cache also promises that to the runtime (`Surface.set_zero_tail`: one
block per head, live up to the rows written), and vane's attention products then read
only those rows; a sequence's copy of a new row keeps the promise itself.

    cache = KVCache(k_flats, v_flats, {0: mask}, n_kv_heads=8, head_dim=128,
                    buckets=(256, 1024))
    cache.lay_out(cache.bucket_for(pos))    # before writing or running a step at pos
    cache.fill(i, k_cols, v_cols)           # prefill: [KVD, n] program outputs
    cache.append(i, pos, k_new, v_new)      # decode: [KV, hd] rows of one position
    cache.put(i, pos, k_cols, v_cols)       # verify: [KVD, n] columns from pos on
                                            # (or a sequence copy: append_copy, appended)
    cache.commit(pos, pos + 1)              # the next step attends to these positions
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from orion.errors import InvalidArgumentError
from orion.ir.composites import MASK_VALUE
from orion.models.base import smallest_bucket

if TYPE_CHECKING:
    from orion.runtime import Surface


class KVCache:
    """Head-major key/value caches of every layer and the position mask they share.

    k_flat, v_flat: per layer, a flat fp16 view of the cache surface (at least
                    n_kv_heads * T * head_dim items for the largest bucket T)
    masks:          window -> fp16 view of a mask input, one item per position: 0 for
                    a position the next decode step attends to, MASK_VALUE for the
                    rest. Window 0 is every written position; window W the W most
                    recent ones counting the next token itself (a sliding-window
                    layer's: the token at p sees p - W + 1 .. p)
    buckets:        the decode buckets, sorted; the largest is the context, and the
                    (empty) cache is laid out for the smallest first
    surfaces:       the surfaces behind k_flat then v_flat, to keep their zero-tail
                    promise on; none: no promise
    """

    def __init__(self, k_flat: Sequence[np.ndarray], v_flat: Sequence[np.ndarray],
                 masks: Mapping[int, np.ndarray], n_kv_heads: int, head_dim: int,
                 buckets: Sequence[int], surfaces: Sequence[Surface] = ()) -> None:
        self._flats = [*k_flat, *v_flat]
        self._layers = len(k_flat)
        if surfaces and len(surfaces) != len(self._flats):
            raise InvalidArgumentError(f"{len(surfaces)} surfaces for {len(self._flats)} caches")
        self._surfaces = list(surfaces)
        self._masks = dict(masks)
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.used = 0   # positions written since the last clear; all else is zero
        self._committed = 0   # positions the next step attends to (before windows)
        for f in self._flats:
            f[...] = 0
        for m in self._masks.values():
            m[...] = MASK_VALUE
        self.buckets = tuple(buckets)
        self.bucket = 0
        self._heads: list[np.ndarray] = []
        self.lay_out(self.buckets[0])

    def bucket_for(self, pos: int) -> int:
        """The bucket of a decode step at position `pos` (the largest when the cache is
        full: nothing decodes then, and a prefill of the whole context lays it out)."""
        return smallest_bucket(self.buckets, min(pos + 1, self.buckets[-1]))

    def _views(self, bucket: int) -> list[np.ndarray]:
        n = self.n_kv_heads * bucket * self.head_dim
        return [f[:n].reshape(self.n_kv_heads, bucket, self.head_dim) for f in self._flats]

    def lay_out(self, bucket: int) -> None:
        """Lays the cache out for decode bucket `bucket` (a no-op when it is): the live
        rows move to their places in the new layout, their old places become zero."""
        if bucket == self.bucket:
            return
        if bucket < self.used:
            raise InvalidArgumentError(f"a cache of {bucket} positions cannot hold the {self.used} "
                                       "written")
        new = self._views(bucket)
        n = self.used
        if n:
            for old, dst in zip(self._heads, new, strict=True):
                live = old[:, :n].copy()   # the two layouts overlap in memory
                old[:, :n] = 0
                dst[:, :n] = live
        self.bucket, self._heads = bucket, new
        self._promise(range(self._layers))

    def fill(self, layer: int, k_cols: np.ndarray, v_cols: np.ndarray) -> None:
        """Writes positions [0, n) of a layer from a prefill program's k, v outputs,
        channel-first [KVD, n] (KVD = KV * hd, head-major channels)."""
        kv, hd = self.n_kv_heads, self.head_dim
        n = k_cols.shape[1]
        self._heads[layer][:, :n] = k_cols.reshape(kv, hd, n).transpose(0, 2, 1)
        self._heads[self._layers + layer][:, :n] = v_cols.reshape(kv, hd, n).transpose(0, 2, 1)
        self.used = max(self.used, n)
        self._promise((layer,))

    def put(self, layer: int, start: int, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        """Writes positions [start, start + n) of a layer from [n, KVD] rows (a verify
        program's k_new, v_new: speculative decoding)."""
        kv, hd = self.n_kv_heads, self.head_dim
        n = k_rows.shape[0]
        self._heads[layer][:, start: start + n] = k_rows.reshape(n, kv, hd).transpose(1, 0, 2)
        self._heads[self._layers + layer][:, start: start + n] = \
            v_rows.reshape(n, kv, hd).transpose(1, 0, 2)
        self.appended(start + n - 1)
        self._promise((layer,))

    def append(self, layer: int, pos: int, k_new: np.ndarray, v_new: np.ndarray) -> None:
        """Writes position `pos` of a layer: k_new, v_new [KV, hd] (one strided write
        across the heads each)."""
        self._heads[layer][:, pos] = k_new
        self._heads[self._layers + layer][:, pos] = v_new
        self.appended(pos)
        self._promise((layer,))

    def layer_rows(self, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of positions [0, n) of a layer's key and value caches: [KV, n, hd]."""
        return self._heads[layer][:, :n], self._heads[self._layers + layer][:, :n]

    def append_copy(self) -> dict[str, int]:
        """What `append` writes, in bytes, for a copy an `orion.runtime.sequence.EvalSequence`
        runs at position `pos` in the current layout: row h of a packed [KV, hd] source
        goes to head h's row `pos`. Call `appended(pos)` after the run."""
        heads = self._heads[0]   # [KV, T, hd]: the layout's strides, not worked out again
        row = heads.strides[1]
        return {"rows": heads.shape[0], "row_bytes": row, "src_stride": row,
                "dst_stride": heads.strides[0], "dst_step": row}

    def appended(self, pos: int) -> None:
        """Position `pos` was written in every layer (by `append` or a sequence, whose
        copies widened the surfaces' promise themselves)."""
        if pos >= self.used:
            self.used = pos + 1

    def commit(self, start: int, stop: int) -> None:
        """Positions [start, stop) hold keys and values every layer wrote: the next
        decode step (at `stop`) attends to them, a windowed layer to those still in its
        window."""
        for window, m in self._masks.items():
            m[start:stop] = 0
            if window:
                m[: max(0, stop - window + 1)] = MASK_VALUE
        self._committed = max(self._committed, stop)

    def truncate(self, n: int) -> None:
        """Keeps positions [0, n); the rest become zero and masked. The layout stays."""
        if n < self.used:
            for h in self._heads:
                h[:, n: self.used] = 0
            self.used = n
            self._promise(range(self._layers))
        if n < self._committed:
            for window, m in self._masks.items():
                m[n:] = MASK_VALUE
                if window:   # positions back inside the window of a step at n
                    m[max(0, n - window + 1): n] = 0
            self._committed = n

    def _promise(self, layers: Sequence[int]) -> None:
        """Tells the runtime, for these layers' surfaces, that each head's rows from
        `used` on are zero: the truth after every write the cache makes."""
        if not self._surfaces:
            return
        row = self.head_dim * 2
        for layer in layers:
            for i in (layer, self._layers + layer):
                self._surfaces[i].set_zero_tail(self.bucket * row, self.used * row)

    def clear(self) -> None:
        self.truncate(0)

    def release(self) -> None:
        """Drops the views of the surfaces (they pin them) before the surfaces go."""
        self._flats, self._heads, self._masks, self._surfaces = [], [], {}, []
