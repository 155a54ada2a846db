"""orion.extras: the install hint of an optional extra names commands that work from a
checkout (orion-ane is on no index yet) and the packages pyproject.toml lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from orion.extras import extra_packages, install_hint, missing_extra

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("extra", ["serve", "plot"])
def test_packages_are_pyprojects(extra):
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"][extra]
    assert extra_packages(extra) == declared


def test_hint_works_from_a_checkout_and_is_honest_about_the_index():
    hint = install_hint("serve")
    assert "pip install '.[serve]' from an Orion checkout" in hint
    assert "'uvicorn>=0.30'" in hint
    assert "'orion-ane[serve]' only where a package index carries orion-ane" in hint


def test_missing_extra_names_the_module():
    err = missing_extra("serve", "orion serve", ModuleNotFoundError("x", name="uvicorn"))
    assert isinstance(err, ImportError)
    assert str(err).startswith("orion serve needs uvicorn, which is not installed; ")


def test_no_other_hint_sends_users_to_an_index():
    """Every install hint in the package goes through install_hint."""
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "orion").rglob("*.py")
                 if p.name != "extras.py" and "orion-ane[" in p.read_text(encoding="utf-8")]
    assert not offenders
