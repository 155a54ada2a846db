from __future__ import annotations

import pytest
from asset_paths import require_asset

from orion.formats.llama2c import read_tokenizer_bin, write_tokenizer_bin
from orion.tokenizers.sentencepiece import SentencePieceTokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def llama2() -> SentencePieceTokenizer:
    return SentencePieceTokenizer(require_asset("llama2/tokenizer.model"))


def test_llama2_tokenizer(llama2):
    assert llama2.vocab_size == 32000
    assert llama2.encode("Hello world") == [15043, 3186]
    assert llama2.encode("Hello world", bos=True) == [1, 15043, 3186]
    assert (llama2.bos_token_id, llama2.eos_token_id) == (1, 2)
    text = "Once upon a time, 12 naïve cats"
    assert llama2.decode(llama2.encode(text)) == text


def test_tokenizer_bin_matches_llama2c_export(llama2, tmp_path):
    """Our tokenizer.bin export is byte for byte llama2.c's tokenizer.bin."""
    write_tokenizer_bin(tmp_path / "tokenizer.bin", llama2.pieces())
    export = require_asset("llama2/tokenizer.bin")
    assert (tmp_path / "tokenizer.bin").read_bytes() == export.read_bytes()
    assert read_tokenizer_bin(export, 32000)[15043][0] == b" Hello"


def test_trained_vocabulary(tmp_path):
    corpus = require_asset("text/tinyshakespeare_input.txt")
    tok = train_sentencepiece(corpus, 600, tmp_path / "sp.model")
    assert tok.vocab_size == 600
    line = "First Citizen:\nBefore we proceed any further, hear me speak."
    ids = tok.encode(line)
    assert tok.decode(ids) == line
    assert len(ids) < 0.6 * len(line)  # merges learned from the corpus
    odd = "café ☃"  # not in the corpus: byte fallback, no <unk>
    assert tok.decode(tok.encode(odd)) == odd
    assert tok.decode_bytes(tok.encode(odd)).decode("utf-8").strip() == odd
    again = train_sentencepiece(corpus, 600, tmp_path / "sp2.model")
    assert again.pieces() == tok.pieces()  # deterministic vocabulary
