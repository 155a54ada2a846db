"""Where the tests find the real files that live outside the repository (tokenizer
folders, text corpora): `$ORION_TEST_ASSETS`, default `../shared/assets` beside the
checkout. One function, so the lookup can change in one place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "assets"


def shared_asset(relative: str) -> Path:
    """The asset `relative` under the assets folder; skips the test, naming the file
    and the variable, when it is not there."""
    root = Path(os.environ.get("ORION_TEST_ASSETS", DEFAULT))
    path = root / relative
    if not path.exists():
        pytest.skip(f"{path} is not here (set ORION_TEST_ASSETS to the folder holding "
                    f"the shared test assets; default ../shared/assets)")
    return path
