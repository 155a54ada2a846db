"""JSON from outside (config files, data lines, request bodies), parsed with bounds.

The standard library's parser is used as it is, with two limits it lacks:

- an integer literal longer than `MAX_INT_DIGITS` digits is refused. Python converts
  up to 4300 digits (in time quadratic in the length) and raises a plain ValueError
  past that; no field Orion reads needs more than a seed's 20 digits, and a 400-digit
  integer would overflow `float()` later;
- nesting past the parser's own limit (it stops with a RecursionError) is an error
  saying so.

Every failure is a `JSONInputError` whose message gives the position, never the text.
"""

from __future__ import annotations

import json
from typing import Any

from orion.errors import OrionError

MAX_INT_DIGITS = 64


class JSONInputError(OrionError, ValueError):
    """Text that is not JSON, or JSON past a bound; the message says which and where."""


class _LongInteger(Exception):
    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def _integer(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise _LongInteger(digits)
    return int(text)


def loads(data: str | bytes | bytearray) -> Any:
    """`json.loads(data)` within the bounds above (NaN and Infinity are accepted as
    the standard library accepts them; validators refuse them where they matter)."""
    try:
        return json.loads(data, parse_int=_integer)
    except _LongInteger as exc:
        raise JSONInputError(f"an integer of {exc.digits} digits (at most {MAX_INT_DIGITS} "
                             "are read)") from None
    except json.JSONDecodeError as exc:
        reason = exc.msg.removesuffix(" at")   # "Invalid control character at"
        raise JSONInputError(f"not valid JSON ({reason}, line {exc.lineno}, column "
                             f"{exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise JSONInputError(f"not UTF-8 (bad byte at offset {exc.start})") from None
    except RecursionError:   # the C scanner stops deep nesting safely with this
        raise JSONInputError("JSON nested too deeply") from None
