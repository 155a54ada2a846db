"""argparse types for numeric options, checked at parse: a value out of range (a NaN
learning rate, a negative count) is a one-line usage error naming the option, before
any model is loaded or any file written.

    p.add_argument("--lr", type=real(low=0.0), default=1e-4)
    p.add_argument("--iters", type=integer(low=1), default=100)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def real(low: float | None = None, high: float | None = None, *,
         low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """A finite float within [low, high] (an end open with `low_open`, `high_open`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if low_open else '>='} {low:g}, got {text}")
        if high is not None and (value >= high if high_open else value > high):
            raise argparse.ArgumentTypeError(
                f"must be {'<' if high_open else '<='} {high:g}, got {text}")
        return value

    parse.__name__ = "number"   # argparse names the type in its own messages
    return parse


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """A decimal integer within [low, high] (at most 20 digits, so no huge conversion)."""

    def parse(text: str) -> int:
        digits = text.strip().lstrip("+-")
        if not (digits.isascii() and digits.isdecimal()) or len(digits) > 20:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer")
        value = int(text)
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse
