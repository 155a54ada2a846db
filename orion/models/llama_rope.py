"""RoPE frequencies of the Llama family, with Hugging Face's `rope_scaling` kinds.

`inv_freq` is `transformers`' `_compute_default_rope_parameters`, `linear` and
`_compute_llama3_parameters` (Llama 3.1/3.2), computed in fp64; `tables` gives the
rotate-half cos/sin for any positions (a prefill bucket, or one decode position).
"""

from __future__ import annotations

import math

import numpy as np

from orion.models.llama_config import LlamaConfig


def inv_freq(cfg: LlamaConfig) -> np.ndarray:
    """[head_dim / 2] angular frequencies, scaled as the config says."""
    hd = cfg.head_dim
    base = 1.0 / cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    s = cfg.rope_scaling
    if s is None:
        return base
    if s.kind == "linear":
        return base / s.factor
    if s.kind != "llama3":
        raise ValueError(f"rope_scaling kind {s.kind!r} is not implemented")
    old = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = np.where(wavelen > low_wavelen, base / s.factor, base)
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def tables(cfg: LlamaConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [len(positions), head_dim] (both halves of a head share a frequency)."""
    ang = np.outer(np.asarray(positions, np.float64), inv_freq(cfg))
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang), np.sin(ang)
