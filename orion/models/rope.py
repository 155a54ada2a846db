"""Rotary position embeddings: one definition for every architecture and every path.

`Rope` holds a layer's rotary settings (base, scaling, the dimensions it rotates);
`inv_freq` gives the angular frequencies in fp64 as transformers computes them
(`_compute_default_rope_parameters`, `linear`, `llama3`, `longrope`), `rows` the cos
and signed sin of any positions, which the prefill programs bake and decode feeds as an
input. In the graph, `apply` rotates x by x cos + rotate_half(x) sin, with
rotate_half(x) = swap(x) * [-1.., +1..] built by pad + add (no concat, ANE-C01).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orion.ir.graph import Graph, Value


@dataclass(frozen=True)
class RopeScaling:
    """Hugging Face `rope_scaling`:

    "linear"    every frequency divided by `factor`
    "llama3"    Llama 3.1/3.2: the low frequencies divided by `factor`, the high ones
                kept, a blend between (low_freq_factor, high_freq_factor)
    "longrope"  Phi-3: each frequency divided by its own factor, `short_factor` while the
                context stays within original_max_position_embeddings, `long_factor`
                beyond; cos and sin scaled by sqrt(1 + ln(factor) / ln(original))
    """

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float | None = None


KINDS = ("linear", "llama3", "longrope")


@dataclass(frozen=True)
class Rope:
    """The rotation of one attention layer: `dims` (a head's size) rotated with
    frequencies from `theta`, scaled as `scaling` says; `long` picks longrope's long
    factors (the runtime sets it when its context passes the original one)."""

    theta: float
    dims: int
    scaling: RopeScaling | None = None
    long: bool = False

    def inv_freq(self) -> np.ndarray:
        """[dims / 2] angular frequencies (fp64)."""
        base = 1.0 / self.theta ** (np.arange(0, self.dims, 2, dtype=np.float64) / self.dims)
        s = self.scaling
        if s is None:
            return base
        if s.kind == "linear":
            return base / s.factor
        if s.kind == "longrope":
            ext = np.asarray(s.long_factor if self.long else s.short_factor, np.float64)
            return base / ext
        old = s.original_max_position_embeddings
        low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
        wavelen = 2 * math.pi / base
        scaled = np.where(wavelen > low_wavelen, base / s.factor, base)
        smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)

    def attention_factor(self) -> float:
        """What cos and sin are multiplied by (longrope's magnitude correction; 1 else)."""
        s = self.scaling
        if s is None or s.kind != "longrope":
            return 1.0
        if s.attention_factor is not None:
            return s.attention_factor
        if s.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_position_embeddings))

    def tables(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [len(positions), dims] (both halves of a head share a frequency)."""
        ang = np.outer(np.asarray(positions, np.float64), self.inv_freq())
        ang = np.concatenate([ang, ang], axis=1)
        f = self.attention_factor()
        return np.cos(ang) * f, np.sin(ang) * f

    def signed(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and the signed sin (-sin on the first half: rotate_half's sign) [n, dims]."""
        cos, sin = self.tables(positions)
        half = self.dims // 2
        return cos, np.concatenate([-sin[:, :half], sin[:, half:]], axis=1)

    def rows(self, start: int, n: int) -> np.ndarray:
        """[n, 2, dims] fp32: the decode input of positions start .. start + n - 1."""
        cos, sin = self.signed(np.arange(start, start + n))
        return np.stack([cos, sin], axis=1).astype(np.float32)


def _swap_halves(g: Graph, x: Value, axis: int, name: str) -> Value:
    """[x1, x2] -> [x2, x1] along `axis` (pad + add, no concat: ANE-C01)."""
    shape = list(x.shape)
    half = shape[axis] // 2
    size = shape.copy()
    size[axis] = half
    hi_begin = [0] * 4
    hi_begin[axis] = half
    x1 = g.slice(x, [0] * 4, size, name=f"{name}_x1")
    x2 = g.slice(x, hi_begin, size, name=f"{name}_x2")
    after = [(0, 0)] * 4
    before = [(0, 0)] * 4
    after[axis] = (0, half)
    before[axis] = (half, 0)
    return g.add(g.pad(x2, after, name=f"{name}_x2p"), g.pad(x1, before, name=f"{name}_x1p"),
                 name=f"{name}_swap")


def apply(g: Graph, x: Value, cos: Value, sin_signed: Value, axis: int, name: str) -> Value:
    """x cos + rotate_half(x) sin, the head dimension on `axis`."""
    with g.composite("rope", name):
        rot = g.mul(_swap_halves(g, x, axis, "r"), sin_signed, name="rot")
        y = g.add(g.mul(x, cos, name="xc"), rot, name="y")
    return y
