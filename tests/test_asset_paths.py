"""The tests' asset lookup: shipped files first, then $ORION_TEST_ASSETS, and a skip
that names the missing file and the variable."""

from __future__ import annotations

import hashlib

import asset_paths
import pytest

# sha256 of the shipped files as published (see NOTICE and tests/data/*/LICENSE.*)
SHIPPED = {
    "gpt2/encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "gpt2/vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "llama2/tokenizer.model": "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347",
    "llama2/tokenizer.bin": "50a52ef822ee9e83de5ce9d0be0a025a773d019437f58b5ff9dcafb063ece361",
    "text/tinyshakespeare_input.txt":
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_assets_are_the_published_files(name):
    path = asset_paths.find_asset(name)
    assert path == asset_paths.SHIPPED / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHIPPED[name]


def test_env_folder_is_searched_after_the_shipped_one(tmp_path, monkeypatch):
    (tmp_path / "tokenizers" / "llama3").mkdir(parents=True)
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "vocab.bpe").write_text("not the shipped one")
    monkeypatch.setenv(asset_paths.ENV, str(tmp_path))
    monkeypatch.setattr(asset_paths, "BESIDE", tmp_path / "absent")
    assert asset_paths.find_asset("tokenizers/llama3") == tmp_path / "tokenizers" / "llama3"
    assert asset_paths.find_asset("gpt2/vocab.bpe") == asset_paths.SHIPPED / "gpt2/vocab.bpe"


def test_missing_asset_skips_naming_file_and_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(asset_paths.ENV, str(tmp_path))
    monkeypatch.setattr(asset_paths, "BESIDE", tmp_path / "absent")
    with pytest.raises(pytest.skip.Exception) as info:
        asset_paths.require_asset("tokenizers/qwen2/tokenizer.json")
    assert "tokenizers/qwen2/tokenizer.json" in str(info.value)
    assert "$ORION_TEST_ASSETS" in str(info.value)
