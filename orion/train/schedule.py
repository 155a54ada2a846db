"""Learning rate: linear warm-up, then cosine decay to min_lr (nanoGPT's get_lr)."""

from __future__ import annotations

import math


def cosine_lr(step: int, lr: float, warmup: int, total: int, min_lr: float) -> float:
    """lr at optimizer step `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    span = max(1, total - warmup)
    ratio = (step - warmup) / span
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
