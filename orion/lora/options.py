"""The one validator of `LoraTrainConfig` (orion.lora.trainer): every field's type and
range, checked when the config is made, before a model is loaded or a file written.
A NaN learning rate used to train 100 steps and write an adapter of NaNs, exit 0."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from orion.errors import LoraError

SCHEDULES = ("constant", "cosine")
MAX_COUNT = 1 << 24
# field -> (kind, low, high), bounds inclusive, None: unbounded
_RANGES: dict[str, tuple[str, float, float | None]] = {
    "iters": ("int", 1, MAX_COUNT), "batch_size": ("int", 1, 1 << 16),
    "grad_accum": ("int", 1, 1 << 16), "warmup": ("int", 0, MAX_COUNT),
    "max_seq_length": ("int", 1, 1 << 20), "val_every": ("int", 0, MAX_COUNT),
    "val_batches": ("int", -1, MAX_COUNT), "save_every": ("int", 0, MAX_COUNT),
    "seed": ("int", 0, (1 << 63) - 1), "rank": ("int", 1, 1 << 16),
    "lr": ("float", 0.0, None), "min_lr": ("float", 0.0, None),
    "weight_decay": ("float", 0.0, None), "loss_scale": ("float", 1.0, 2.0 ** 24),
    "alpha": ("float", 0.0, None), "dropout": ("float", 0.0, 1.0),
}
# bounds that are open: alpha > 0 (a zero scale trains nothing), dropout < 1
_OPEN_LOW, _OPEN_HIGH = {"alpha"}, {"dropout"}


def check_number(name: str, value: Any, kind: str, low: float, high: float | None) -> None:
    """Refuses `value` unless it is a finite number of `kind` within the bounds."""
    if isinstance(value, bool) or not isinstance(value, Integral if kind == "int" else Real):
        want = "an integer" if kind == "int" else "a number"
        raise LoraError(f"{name} must be {want}, got {value!r}")
    if not math.isfinite(value):
        raise LoraError(f"{name} must be finite, got {value!r}")
    too_low = value <= low if name in _OPEN_LOW else value < low
    too_high = high is not None and (value >= high if name in _OPEN_HIGH else value > high)
    if too_low or too_high:
        lo = f"({low:g}" if name in _OPEN_LOW else f"[{low:g}"
        hi = "inf)" if high is None else (f"{high:g})" if name in _OPEN_HIGH else f"{high:g}]")
        raise LoraError(f"{name} must be in {lo}, {hi}, got {value!r}")


def check_train_config(config: Any) -> None:
    """Every numeric field in range, a known schedule, min_lr <= lr, some targets."""
    for name, (kind, low, high) in _RANGES.items():
        check_number(name, getattr(config, name), kind, low, high)
    if config.lr_schedule not in SCHEDULES:
        raise LoraError(f"lr schedule {config.lr_schedule!r} is not one of {SCHEDULES}")
    if config.lr_schedule == "cosine" and config.min_lr > config.lr:
        raise LoraError(f"min_lr {config.min_lr} is above lr {config.lr}")
    targets = config.targets
    if isinstance(targets, str) or not targets or not all(isinstance(t, str) for t in targets):
        raise LoraError(f"targets must be module names, got {targets!r}")
