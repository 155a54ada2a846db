"""Fixtures the hostile-input modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostile.helpers import write_gpt2_folder


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    """A small valid GPT-2 folder each module copies before damaging it."""
    return write_gpt2_folder(tmp_path_factory.mktemp("gpt2"))
