"""The training loss on the host: cross-entropy over the vocabulary, and its gradient."""

from __future__ import annotations

import numpy as np


def cross_entropy(logits: np.ndarray, targets: np.ndarray, scale: float = 1.0,
                  in_place: bool = False) -> tuple[float, np.ndarray]:
    """(mean loss, d loss / d logits * scale) for logits [..., V], integer targets [...].
    With in_place the gradient is written over `logits` (a C-contiguous float array):
    a vocabulary-wide logits array is large (32 MB for 256 positions of 32,000), and
    each temporary of that size is fresh pages to fault in."""
    flat = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    n = t.size
    rows = np.arange(n)
    d = np.subtract(flat, flat.max(axis=-1, keepdims=True), out=flat if in_place else None)
    shifted_target = d[rows, t].astype(np.float64)      # logit[t] - max
    np.exp(d, out=d)
    se = d.sum(axis=-1, keepdims=True)
    # loss = log sum exp(logits) - logit[t] = log(sum exp(logits - max)) - (logit[t] - max)
    loss = float(np.mean(np.log(se[:, 0].astype(np.float64)) - shifted_target))
    d *= (np.float32(scale / n) / se).astype(d.dtype)
    d[rows, t] -= d.dtype.type(scale / n)
    return loss, d.reshape(logits.shape)
