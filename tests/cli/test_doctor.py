"""`orion doctor` prints what it found: the library and every backend with its state."""

from __future__ import annotations

from orion.cli import main
from orion.runtime import backends


def test_doctor_lists_backends_and_why(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "library: " in out
    assert f"backends usable: {', '.join(backends())}" in out
    ane = next(line for line in out.splitlines() if line.strip().startswith("ane: "))
    # either found (with where from), unavailable with the reason, or not built
    assert any(s in ane for s in ("available: ", "unavailable: ", "not built into this library"))
    assert "vane: available" in out
    assert "backend for new programs: " in out
