"""The tests' asset lookup: shipped files first (compressed ones unpacked), then
$ORION_TEST_ASSETS, and a skip that names the missing file and the variable. Every
asset a test asks for ships in tests/data, so a fresh clone skips none of them."""

from __future__ import annotations

import hashlib
import lzma
import re
from pathlib import Path

import asset_paths
import pytest

# sha256 of the shipped files as published (see NOTICE and tests/data/*/LICENSE.*); the
# tokenizer.json files as unpacked from their .xz
SHIPPED = {
    "gpt2/encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "gpt2/vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "llama2/tokenizer.model": "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347",
    "llama2/tokenizer.bin": "50a52ef822ee9e83de5ce9d0be0a025a773d019437f58b5ff9dcafb063ece361",
    "text/tinyshakespeare_input.txt":
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    "tokenizers/llama3/tokenizer.json":
        "44cf9b613621ccb43e038d7964e8b12b5b5b4650f3be2daa7fef21b39f39da46",
    "tokenizers/qwen2/tokenizer.json":
        "343203c185c028d17f2cf20c23e163acf6c08d53eb59e413360eeb188edeb353",
}
TESTS = Path(__file__).resolve().parent
ASKED = re.compile(r"""require_asset\(\s*(f?)["']([^"']+)["']""")


@pytest.fixture
def only_shipped(monkeypatch):
    """The lookup as on a fresh clone: no $ORION_TEST_ASSETS."""
    monkeypatch.delenv(asset_paths.ENV, raising=False)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_assets_are_the_published_files(name, only_shipped):
    path = asset_paths.find_asset(name)
    assert path is not None, name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHIPPED[name]


def test_compressed_folder_is_handed_out_unpacked_whole(only_shipped):
    folder = asset_paths.find_asset("tokenizers/qwen2")
    assert folder is not None and folder != asset_paths.SHIPPED / "tokenizers/qwen2"
    names = {f.name for f in folder.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= names
    assert not any(n.endswith(".xz") for n in names)
    # a second lookup reuses the unpacked copy
    before = (folder / "tokenizer.json").stat().st_mtime_ns
    assert asset_paths.find_asset("tokenizers/qwen2") == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == before


def test_a_changed_archive_is_unpacked_again(tmp_path, monkeypatch):
    packed = tmp_path / "x.txt.xz"
    packed.write_bytes(lzma.compress(b"first"))
    monkeypatch.setattr(asset_paths, "UNPACKED", tmp_path / "cache")
    dest = tmp_path / "cache" / "x.txt"
    assert asset_paths._unpacked_file(packed, dest).read_bytes() == b"first"
    packed.write_bytes(lzma.compress(b"second"))
    assert asset_paths._unpacked_file(packed, dest).read_bytes() == b"second"


def test_every_asset_a_test_asks_for_ships(only_shipped):
    """Every literal name passed to require_asset in tests/ and benchmarks/, and each
    tokenizer folder the parametrized ones name, resolves without $ORION_TEST_ASSETS."""
    names = {"tokenizers/llama3", "tokenizers/qwen2"}
    sources = [*TESTS.rglob("*.py"), *(TESTS.parent / "benchmarks").rglob("*.py")]
    for src in (s for s in sources if s.name != "test_asset_paths.py"):   # not its examples
        for fstring, name in ASKED.findall(src.read_text(encoding="utf-8")):
            if not fstring:
                names.add(name)
    for name in sorted(names):
        assert asset_paths.find_asset(name) is not None, name


def test_env_folder_is_searched_after_the_shipped_one(tmp_path, monkeypatch):
    (tmp_path / "tokenizers" / "mistral").mkdir(parents=True)
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "vocab.bpe").write_text("not the shipped one")
    monkeypatch.setenv(asset_paths.ENV, str(tmp_path))
    assert asset_paths.find_asset("tokenizers/mistral") == tmp_path / "tokenizers" / "mistral"
    assert asset_paths.find_asset("gpt2/vocab.bpe") == asset_paths.SHIPPED / "gpt2/vocab.bpe"


def test_missing_asset_skips_naming_file_and_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(asset_paths.ENV, str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as info:
        asset_paths.require_asset("tokenizers/mistral/tokenizer.json")
    message = str(info.value)
    assert "tokenizers/mistral/tokenizer.json" in message
    assert "$ORION_TEST_ASSETS" in message
    # nothing that only the project's own machines have
    assert "shared" not in message and str(asset_paths.REPO.parent) not in message
