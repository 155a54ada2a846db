"""orion.tokenizers.backend against the tokenizers library's own JSON reader: the same
tokenizer, serialized byte for byte, for real published tokenizer.json files, a GGUF
vocabulary and a BPE with every setting the reader takes; the reader's errors where it
refuses a document."""

from __future__ import annotations

import json

import pytest
from asset_paths import require_asset
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from orion.tokenizers.backend import backend_from_document


def _same_as_the_reader(text: str) -> Tokenizer:
    ours = backend_from_document(json.loads(text), text)
    assert ours.to_str() == Tokenizer.from_str(text).to_str()
    return ours


@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_a_published_tokenizer_is_the_readers(name):
    text = (require_asset(f"tokenizers/{name}") / "tokenizer.json").read_text(encoding="utf-8")
    ours = _same_as_the_reader(text)
    sample = "Hello <|endoftext|> naïve 12345 東京\n\n  x<|im_start|>"
    assert ours.encode(sample).ids == Tokenizer.from_str(text).encode(sample).ids


def test_a_gguf_vocabulary_is_the_readers():
    from quant.gguf_writer import vocab_metadata

    from orion.tokenizers import gguf

    meta = vocab_metadata(require_asset("tokenizers/qwen2") / "tokenizer.json", "qwen2",
                          eos="<|endoftext|>")
    doc = gguf._backend_document(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"],
                                 meta["tokenizer.ggml.token_type"], "qwen2", "m.gguf")
    text = json.dumps(doc)
    assert backend_from_document(doc).to_str() == Tokenizer.from_str(text).to_str()
    tok, reader = gguf.gguf_tokenizer(meta, "m.gguf"), Tokenizer.from_str(text)
    sample = "Hello <|endoftext|> naïve 12345 東京\n\n  x"
    assert tok is not None and tok.encode(sample) == reader.encode(sample).ids


def test_every_bpe_setting_and_added_token_flag_carries_over():
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3, "##a": 4, "##b": 5, "##ab": 6, "abc": 7}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "##b"), ("##a", "##b")],
                               unk_token="[UNK]", continuing_subword_prefix="##", fuse_unk=True,
                               byte_fallback=True, dropout=0.25, ignore_merges=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tok.add_tokens([AddedToken("<x>", single_word=True, lstrip=True, normalized=False), "hello"])
    tok.add_special_tokens([AddedToken("<s>", rstrip=True, normalized=False), "abc"])
    text = tok.to_str()
    assert _same_as_the_reader(text).to_str() == text
    suffixed = Tokenizer(models.BPE(vocab={"a": 0, "b</w>": 1, "ab</w>": 2},
                                    merges=[("a", "b</w>")], end_of_word_suffix="</w>"))
    assert _same_as_the_reader(suffixed.to_str()).to_str() == suffixed.to_str()


def test_added_tokens_take_the_ids_the_reader_gives():
    """The reader adds a document's added tokens in its order, whatever ids it names
    (out of order, with gaps, twice)."""
    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    tok.add_tokens(["<x>", "<y>", "ab"])
    tok.add_special_tokens(["<z>"])
    doc = json.loads(tok.to_str())
    x, y, ab, z = doc["added_tokens"]
    doc["added_tokens"] = [dict(z, id=10), dict(y, id=5), dict(x, id=5), dict(ab, id=9),
                           dict(z, id=7)]
    _same_as_the_reader(json.dumps(doc))


def test_other_models_go_through_the_reader():
    text = Tokenizer(models.Unigram([("a", -1.0), ("b", -2.0)], 0, False)).to_str()
    assert _same_as_the_reader(text).to_str() == text


@pytest.mark.parametrize("change", [
    lambda m: m.update(merges=["a b c"]),              # not two tokens
    lambda m: m.update(merges=[["a", 1]]),
    lambda m: m.update(merges=["a zz"]),                # a token the vocabulary lacks
    lambda m: m.update(vocab={"a": "0"}),
    lambda m: m.update(vocab=["a"]),
])
def test_a_document_the_reader_refuses_is_refused_alike(change):
    doc = json.loads(Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2},
                                          merges=[("a", "b")])).to_str())
    change(doc["model"])
    text = json.dumps(doc)
    with pytest.raises(Exception) as theirs:
        Tokenizer.from_str(text)
    with pytest.raises(Exception) as ours:
        backend_from_document(doc, text)
    assert str(theirs.value).split(" at line ")[0] in str(ours.value)   # no position here


def test_added_tokens_with_bad_flags_go_through_the_reader():
    doc = json.loads(Tokenizer(models.BPE(vocab={"a": 0}, merges=[])).to_str())
    doc["added_tokens"] = [{"id": 1, "content": "<s>", "special": "yes"}]
    text = json.dumps(doc)
    with pytest.raises(Exception) as theirs:
        Tokenizer.from_str(text)
    with pytest.raises(Exception) as ours:
        backend_from_document(doc, text)
    assert str(ours.value) == str(theirs.value)
