"""Fixtures of the training tests: the real corpora and a backend to train on (vane when
the C library loads, else the IR's numpy reference with fp16 rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
from asset_paths import require_asset


def _vane_available() -> bool:
    try:
        from orion.runtime import backends

        return "vane" in backends()
    except Exception:  # noqa: BLE001 - no built library: the reference stands in
        return False


@pytest.fixture(scope="session")
def backend() -> str:
    return "vane" if _vane_available() else "reference"


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    return require_asset("text/tinyshakespeare_input.txt")


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory, shakespeare) -> Path:
    """A 512-piece SentencePiece vocabulary trained on tiny Shakespeare."""
    from orion.models.tokenizer_sp import train_sentencepiece

    out = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    train_sentencepiece(shakespeare, 512, out)
    return out
