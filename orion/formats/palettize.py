"""Palettization: per-grouped-channel LUTs with a per-channel scale, the compressed form
the ANE decompresses on the fly (ANE-C57; coremltools' `OpPalettizerConfig` with
`granularity="per_grouped_channel"` and `enable_per_channel_scale=True`).

A palettized [O, I] weight is stored (`orion convert --palettize`) as three tensors:

    m.weight         U8  [O, I * bits / 8]   the codes, least significant bits first (the
                                             device's sub-byte blob layout), whole bytes
                                             a row
    m.lut            F16 [O / G, 2^bits]     one table per G consecutive output channels
    m.channel_scale  F16 [O]                 one scale per output channel

and w[o, i] = channel_scale[o] * lut[o // G, code[o, i]]. config.json says
`"palettization": {"bits": 4, "group_channels": 16}`; a matrix whose row count that G
does not divide gets the largest smaller G that does (its tables' count says which).
On the device the table expands by `constexpr_lut_to_dense` and the scale multiplies
the conv's output, so the scale costs one multiply per output, not per weight.

`palettize` finds each group's table by k-means on the weights divided by their row's
largest magnitude (the scale): 1-D Lloyd iterations from the quantiles (up to 16
entries; evenly spaced for more) until no value changes cluster, every group of a
tensor at once (each group's values are shifted to a range of their own, so one sorted
search serves them all). Written here rather than taken from scikit-learn, which the
runtime does not depend on, because in one dimension a cluster is a run of the sorted
values: an iteration is a search of k midpoints and prefix sums, a few numpy calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.ir.quant import pack_codes, unpack_codes

BITS = (2, 3, 4, 6, 8)          # index widths of constexpr_lut_to_dense that convert writes
GROUP_CHANNELS = (1, 2, 4, 8, 16, 32, 64)
ITERATIONS = 300                # Lloyd iterations at most (each costs k searches a group)
ROWS_AT_ONCE = 512              # rows clustered at a time (bounded temporaries)
_SPAN = 4.0                     # each group's values moved to [4g - 1, 4g + 1]


@dataclass(frozen=True)
class PaletteSpec:
    """How a folder's matrices are palettized."""

    bits: int
    group_channels: int

    def row_bytes(self, cols: int) -> int:
        return cols * self.bits // 8

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether an [O, I] matrix can be palettized: rows of whole bytes."""
        return len(shape) == 2 and shape[1] * self.bits % 8 == 0

    def group_for(self, rows: int) -> int:
        """Channels a table of an [rows, I] matrix: group_channels, or the largest
        smaller choice that divides rows (GPT-2's 50,257-row classifier: 1)."""
        return max(g for g in GROUP_CHANNELS if g <= self.group_channels and rows % g == 0)

    def to_json(self) -> dict[str, int]:
        return {"bits": self.bits, "group_channels": self.group_channels}

    @classmethod
    def checked(cls, bits: object, group_channels: object, where: str,
                error: type[Exception] = InvalidArgumentError) -> PaletteSpec:
        if not isinstance(bits, int) or isinstance(bits, bool) or bits not in BITS:
            raise error(f"{where}: bits {bits!r} is not one of {', '.join(map(str, BITS))}")
        if (not isinstance(group_channels, int) or isinstance(group_channels, bool)
                or group_channels not in GROUP_CHANNELS):
            raise error(f"{where}: group_channels {group_channels!r} is not one of "
                        f"{', '.join(map(str, GROUP_CHANNELS))}")
        return cls(bits, group_channels)

    @classmethod
    def read(cls, config: Mapping[str, object], where: str) -> PaletteSpec | None:
        """config.json's "palettization" (None when it has none)."""
        p = config.get("palettization")
        if p is None:
            return None
        if not isinstance(p, dict) or set(p) - {"bits", "group_channels"}:
            raise ModelLoadError(f"{where}: palettization must be an object with bits and "
                                 "group_channels only")
        return cls.checked(p.get("bits"), p.get("group_channels"), f"{where}: palettization",
                           ModelLoadError)


def channel_scales(w: np.ndarray) -> np.ndarray:
    """Each row's largest magnitude in fp16 (1 for a row of zeros), rounded up where
    rounding to nearest would leave a normalized weight past 1."""
    peak = np.abs(w).max(axis=1)
    s = peak.astype(np.float16)
    low = s.astype(np.float32) < peak
    s[low] = np.nextafter(s[low], np.float16(np.inf))
    s[peak == 0] = 1
    return s


def _assign(u: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid of each value: u [groups, n] (each group in [-1, 1]),
    centroids [groups, K] sorted -> indices [groups, n]."""
    groups, k = centroids.shape
    shift = (_SPAN * np.arange(groups, dtype=np.float64))[:, None]
    bounds = np.empty((groups, k), np.float64)
    bounds[:, :-1] = (centroids[:, 1:] + centroids[:, :-1]) / 2 + shift
    bounds[:, -1] = shift[:, 0] + _SPAN / 2          # the group's end
    pos = np.searchsorted(bounds.reshape(-1), (u + shift).reshape(-1), side="right")
    return (pos.reshape(groups, -1) - np.arange(groups)[:, None] * k).clip(0, k - 1)


def _kmeans(u: np.ndarray, k: int) -> np.ndarray:
    """1-D k-means of each row of u [groups, n] -> centroids [groups, k], sorted.

    Each group's values are sorted once; a cluster is then a run of them, so an
    iteration finds the runs' ends by searching the k - 1 midpoints among the sorted
    values and their sums from prefix sums: its cost is k searches a group, not n."""
    groups, n = u.shape
    q = (np.arange(k) + 0.5) / k
    if k <= 16:     # few entries: start where the values are dense
        c = np.quantile(u, q, axis=1).T.astype(np.float64)   # [groups, k]
    else:           # many: evenly spaced, or the tails starve (6 bits: 0.039 -> 0.033)
        lo, hi = u.min(axis=1, keepdims=True), u.max(axis=1, keepdims=True)
        c = lo + (hi - lo) * q
    shift = (_SPAN * np.arange(groups, dtype=np.float64))[:, None]
    ordered = np.sort(u, axis=1) + shift                   # globally sorted, flat
    flat = ordered.reshape(-1)
    prefix = np.concatenate([[0.0], np.cumsum((ordered - shift).reshape(-1))])
    ends = np.empty((groups, k + 1), np.int64)
    ends[:, 0] = np.arange(groups) * n
    ends[:, k] = ends[:, 0] + n
    previous = None
    for _ in range(ITERATIONS):
        mid = (c[:, 1:] + c[:, :-1]) / 2 + shift
        ends[:, 1:k] = np.searchsorted(flat, mid.reshape(-1), side="left").reshape(groups, -1)
        if previous is not None and np.array_equal(ends, previous):
            break
        previous = ends.copy()
        counts = np.diff(ends, axis=1)
        sums = prefix[ends[:, 1:]] - prefix[ends[:, :-1]]
        c = np.where(counts > 0, sums / np.maximum(counts, 1), c)
    return c


def palettize(w: np.ndarray, spec: PaletteSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An [O, I] weight (fp32) -> (codes U8 [O, I * bits / 8], lut fp16 [O / G, 2^bits]
    with G = spec.group_for(O), channel_scale fp16 [O]): see the module docstring."""
    w = np.asarray(w, np.float32)
    if not spec.fits(w.shape):
        raise InvalidArgumentError(f"a {list(w.shape)} weight cannot be palettized at "
                                   f"{spec.bits} bits: its rows are not whole bytes")
    rows, cols = w.shape
    g, k = spec.group_for(rows), 1 << spec.bits
    scale = channel_scales(w)
    lut = np.empty((rows // g, k), np.float16)
    codes = np.empty((rows, spec.row_bytes(cols)), np.uint8)
    step = max(g, ROWS_AT_ONCE // g * g)
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        u = w[lo:hi] / scale[lo:hi, None].astype(np.float32)
        c = _kmeans(u.reshape(-1, g * cols).astype(np.float64), k)
        table = c.astype(np.float16)
        # the final codes: nearest among the tables the device holds (fp16)
        final = _assign(u.reshape(-1, g * cols).astype(np.float64), table.astype(np.float64))
        lut[lo // g: hi // g] = table
        codes[lo:hi] = pack_codes(final.reshape(hi - lo, cols), spec.bits).reshape(hi - lo, -1)
    return codes, lut, scale


def dense_fp16(codes: np.ndarray, lut: np.ndarray, scale: np.ndarray, bits: int,
               group: int, rows: np.ndarray | None = None) -> np.ndarray:
    """fp16 rows of a palettized weight, fp16(lut value * scale) (the host's value):
    `codes` [n, I * bits / 8] and `scale` [n] are the tensor's rows `rows` (all, by
    default), `lut` its whole table [O / group, 2^bits]."""
    n = codes.shape[0]
    cols = codes.shape[1] * 8 // bits
    ids = np.arange(n) if rows is None else np.asarray(rows, np.int64).reshape(-1)
    q = unpack_codes(np.ascontiguousarray(codes), bits, n * cols, False)
    values = lut.astype(np.float32)[(ids // group)[:, None], q.reshape(n, cols)]
    return (values * scale.astype(np.float32).reshape(-1, 1)).astype(np.float16)
