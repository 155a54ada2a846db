"""orion.bounded_json: the standard parser with bounds on integer length and nesting."""

from __future__ import annotations

import math

import pytest

from orion.bounded_json import MAX_INT_DIGITS, JSONInputError, loads


def test_ordinary_json_is_what_json_loads_gives():
    assert loads('{"a": [1, -2, 3.5, true, null, "\\u2028"], "b": NaN}')["a"] == [
        1, -2, 3.5, True, None, "\u2028"]
    assert math.isnan(loads("NaN"))
    assert loads("9" * MAX_INT_DIGITS) == int("9" * MAX_INT_DIGITS)


@pytest.mark.parametrize(("text", "reason"), [
    ("1" * (MAX_INT_DIGITS + 1), "65 digits"),
    ("-" + "1" * 5000, "5000 digits"),
    ('{"max_tokens": ' + "9" * 5000 + "}", "5000 digits"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a": }', "not valid JSON \\(Expecting value, line 1, column 7\\)"),
    ('"\x01"', "Invalid control character, line 1"),
    (b"\xff", "not UTF-8"),
])
def test_past_a_bound_is_a_typed_error_without_the_text(text, reason):
    with pytest.raises(JSONInputError, match=reason):
        loads(text)
