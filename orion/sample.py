"""Choosing the next token from logits: greedy, temperature, top-k, top-p, and a
repetition penalty, with a seeded generator so that a run can be repeated.

    sampler = Sampler(SamplingOptions(temperature=0.8, top_p=0.95, seed=0))
    token = sampler(logits, previous_tokens)

Temperature 0 is greedy (argmax; the lowest id wins a tie). Filters apply in the
order transformers uses: repetition penalty, temperature, top-k, top-p. A logit that a
filter pushes past float64's range (a repetition penalty of 1e-320, a temperature of
1e-300) counts as the largest finite value, a NaN logit as never chosen, and logits
with no finite value at all are an `EvalError`: a sampler never picks from garbage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from orion.errors import EvalError, InvalidArgumentError


def _real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SamplingOptions:
    """temperature:        0 for greedy; otherwise logits are divided by it
    top_k:              keep the k most likely tokens (0: all)
    top_p:              keep the smallest set whose probability reaches p (1.0: all)
    repetition_penalty: > 1 makes tokens already in the context less likely (CTRL's
                        rule: positive logits divided by it, negative ones multiplied)
    seed:               seeds the generator; None draws fresh entropy
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        # `not (x >= 0)` and friends refuse NaN too; bools are not numbers here
        t, p, r = (_real(self.temperature, "temperature"), _real(self.top_p, "top_p"),
                   _real(self.repetition_penalty, "repetition_penalty"))
        if not 0.0 <= t < math.inf:
            raise InvalidArgumentError(f"temperature must be finite and >= 0, got {t}")
        if not isinstance(self.top_k, Integral) or isinstance(self.top_k, bool) \
                or self.top_k < 0:
            raise InvalidArgumentError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not 0.0 < p <= 1.0:
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {p}")
        if not 0.0 < r < math.inf:
            raise InvalidArgumentError(f"repetition_penalty must be finite and > 0, got {r}")
        if self.seed is not None and (not isinstance(self.seed, Integral)
                                      or isinstance(self.seed, bool) or self.seed < 0):
            raise InvalidArgumentError(f"seed must be None or an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def apply_repetition_penalty(logits: np.ndarray, previous: Sequence[int],
                             penalty: float) -> np.ndarray:
    if penalty == 1.0 or len(previous) == 0:
        return logits
    out = logits.copy()
    seen = np.unique(np.asarray(previous, dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < out.size)]   # ids past the sampled vocabulary
    picked = out[seen]
    with np.errstate(over="ignore"):   # past float64's range: see finite_logits
        out[seen] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


def top_k_mask(logits: np.ndarray, k: int) -> np.ndarray:
    """Logits with all but the k largest set to -inf (ties at the k-th value kept)."""
    if k <= 0 or k >= logits.size:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits < kth, -np.inf, logits)


def top_p_mask(logits: np.ndarray, p: float) -> np.ndarray:
    """Logits outside the nucleus set to -inf: the most likely tokens whose
    probabilities, most likely first, sum to at least p (always at least one)."""
    if p >= 1.0:
        return logits
    order = np.argsort(-logits, kind="stable")
    probs = softmax(logits[order])
    before = np.cumsum(probs) - probs          # mass of the tokens ahead of each one
    keep = order[before < p]
    out = np.full_like(logits, -np.inf)
    out[keep] = logits[keep]
    return out


def finite_logits(logits: np.ndarray) -> np.ndarray:
    """float64 logits with NaN as -inf (never chosen) and +inf as the largest finite
    value; an EvalError when nothing finite is left to choose from."""
    x = np.asarray(logits, dtype=np.float64)
    if np.isfinite(x).all():
        return x
    x = np.minimum(np.where(np.isnan(x), -np.inf, x), np.finfo(np.float64).max)
    if not np.isfinite(x).any():
        raise EvalError("the model's logits hold no finite value (NaN or infinity "
                        "everywhere): its weights or adapter compute garbage")
    return x


def softmax(logits: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):   # -max - max is -inf: weight 0
        z = logits.astype(np.float64) - np.max(logits)
    e = np.exp(z)
    return e / e.sum()


class Sampler:
    """Picks tokens under fixed options; holds the random generator of one run."""

    def __init__(self, options: SamplingOptions | None = None) -> None:
        self.options = options or SamplingOptions()
        self.rng = np.random.default_rng(self.options.seed)

    def filtered_logits(self, logits: np.ndarray, previous: Sequence[int] = ()) -> np.ndarray:
        """The logits after penalty, temperature, top-k and top-p (float64)."""
        o = self.options
        x = finite_logits(np.reshape(logits, -1))
        if o.repetition_penalty != 1.0:   # dividing can overflow to inf
            x = finite_logits(apply_repetition_penalty(x, previous, o.repetition_penalty))
        if o.greedy:
            return x
        with np.errstate(over="ignore"):
            x = finite_logits(x / o.temperature)
        x = top_k_mask(x, o.top_k)
        return top_p_mask(x, o.top_p)

    def __call__(self, logits: np.ndarray, previous: Sequence[int] = ()) -> int:
        if self.options.greedy and self.options.repetition_penalty == 1.0:
            flat = np.reshape(logits, -1)
            best = int(np.argmax(flat))   # numpy orders NaN above all, +inf above the rest
            if np.isfinite(flat[best]):   # so neither is there: finite_logits' pick
                return best
        x = self.filtered_logits(logits, previous)
        if self.options.greedy:
            return int(np.argmax(x))
        probs = softmax(x)
        return int(self.rng.choice(probs.size, p=probs))
