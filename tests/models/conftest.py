"""Fixtures of the model tests: the real GPT-2 tokenizer files, and Hugging Face
GPT-2 model folders saved at test time (transformers and torch are test-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_ASSETS = Path(__file__).resolve().parents[3] / "shared" / "assets"
GPT2_ASSETS = SHARED_ASSETS / "gpt2"


@pytest.fixture(scope="session")
def gpt2_files() -> Path:
    """The folder with OpenAI's encoder.json and vocab.bpe (../shared/assets/gpt2)."""
    if not (GPT2_ASSETS / "encoder.json").is_file():
        pytest.skip(f"the real GPT-2 tokenizer files are not at {GPT2_ASSETS}")
    return GPT2_ASSETS
