"""Where the tests find real third-party files (tokenizers, corpora): one lookup.

A relative asset name such as "gpt2/encoder.json" or "tokenizers/llama3" is looked
for, in order, in

    tests/data/                 the small assets the repository ships (see NOTICE)
    $ORION_TEST_ASSETS/         a folder you point to, laid out like tests/data
    ../shared/assets/           beside the checkout (the project's own machines)

`require_asset` skips the calling test when it is in none of them, naming the file
and the variable, so that a skip says what to fetch and where to put it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "ORION_TEST_ASSETS"
REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "tests" / "data"
BESIDE = REPO.parent / "shared" / "assets"


def asset_roots() -> list[Path]:
    """The folders searched, in order."""
    roots = [SHIPPED]
    if os.environ.get(ENV):
        roots.append(Path(os.environ[ENV]).expanduser())
    roots.append(BESIDE)
    return roots


def find_asset(name: str) -> Path | None:
    """The first existing `root / name` (a file or a folder), or None."""
    for root in asset_roots():
        path = root / name
        if path.exists():
            return path
    return None


def require_asset(name: str) -> Path:
    """`find_asset(name)`, or a skip that says what is missing and how to supply it."""
    path = find_asset(name)
    if path is None:
        pytest.skip(f"needs the asset {name!r}: put it under ${ENV}/{name} "
                    f"(or {BESIDE}/{name}); not shipped in tests/data, runs where that is set")
    return path
