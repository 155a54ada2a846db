"""fp16 safety on the host side of a step (ane-facts C41).

- `sanitize` replaces NaN by 0 and +-inf by +-65504 in a device result and counts both,
  plus the values sitting exactly at the fp16 bound: the device saturates rather than
  overflowing, so a result at +-65504 is as suspect as an inf (it can be finite
  garbage where IEEE would have given NaN).
- `LossScaler` multiplies the loss gradient so small fp16 gradients do not flush to
  zero, halves the scale when a backward pass overflowed (that step is skipped) and
  doubles it after `growth_interval` clean steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

FP16_MAX = 65504.0


@dataclass
class SanitizeCounts:
    nan: int = 0
    inf: int = 0
    saturated: int = 0

    @property
    def overflow(self) -> bool:
        return (self.nan + self.inf + self.saturated) > 0

    def add(self, other: SanitizeCounts) -> None:
        self.nan += other.nan
        self.inf += other.inf
        self.saturated += other.saturated

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def sanitize(x: np.ndarray, counts: SanitizeCounts | None = None) -> np.ndarray:
    """x with NaN -> 0 and +-inf -> +-65504 (in place when x is writable fp32)."""
    # The common case in two passes without temporaries (min and max propagate NaN):
    # every value finite and inside the fp16 bounds, so there is nothing to count.
    if x.size == 0 or (-FP16_MAX < np.min(x) and np.max(x) < FP16_MAX):
        return x
    nan = np.isnan(x)
    inf = np.isinf(x)
    n_nan, n_inf = int(nan.sum()), int(inf.sum())
    if counts is not None:
        counts.nan += n_nan
        counts.inf += n_inf
        counts.saturated += int(np.count_nonzero(np.abs(x) == FP16_MAX))
    if n_nan or n_inf:
        x = np.nan_to_num(x, copy=not (x.flags.writeable and x.dtype == np.float32),
                          nan=0.0, posinf=FP16_MAX, neginf=-FP16_MAX)
    return x


@dataclass
class LossScaler:
    scale: float = 1024.0
    dynamic: bool = True
    growth_interval: int = 200
    min_scale: float = 1.0
    max_scale: float = 2.0**16
    good_steps: int = field(default=0)

    def update(self, overflow: bool) -> None:
        if not self.dynamic:
            return
        if overflow:
            self.scale = max(self.min_scale, self.scale / 2)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = min(self.max_scale, self.scale * 2)
            self.good_steps = 0

    def state_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)

    def load_state_dict(self, d: dict) -> None:
        for k, v in d.items():
            setattr(self, k, v)
