"""`orion doctor` prints what it found: the library, every backend with its state, and
every environment variable that changes any of it, set or not."""

from __future__ import annotations

import re
from pathlib import Path

from orion.cli import main
from orion.cli.doctor import ENV_VARS
from orion.runtime import backends

REPO = Path(__file__).resolve().parents[2]
READS = re.compile(r"""(?:getenv|environ(?:\.get)?)\s*[(\[]\s*["'](ORION_\w+)["']""")


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


def test_unset_backend_is_shown_unset(capsys, monkeypatch):
    monkeypatch.delenv("ORION_BACKEND", raising=False)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "(ORION_BACKEND unset: auto)" in out and "ORION_BACKEND=" not in out
    monkeypatch.setenv("ORION_BACKEND", "vane")
    assert main(["doctor"]) == 0
    assert "backend for new programs: vane (ORION_BACKEND=vane)" in capsys.readouterr().out


def test_every_variable_the_sources_read_is_listed(capsys, monkeypatch):
    """The help promises the variables that change what doctor shows: every ORION_*
    that csrc/ or orion/ reads at run time is listed, set or unset."""
    sources = [*REPO.glob("csrc/**/*.[chm]"), *REPO.glob("orion/**/*.py")]
    read = {v for src in sources for v in READS.findall(src.read_text(errors="replace"))}
    assert read and read <= set(ENV_VARS), sorted(read - set(ENV_VARS))
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ORION_VANE_ISA", "scalar")
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for var in ENV_VARS:
        (line,) = [x for x in lines if x.strip().startswith(var + (
            "=" if var == "ORION_VANE_ISA" else " unset"))]
        assert ENV_VARS[var] in line
