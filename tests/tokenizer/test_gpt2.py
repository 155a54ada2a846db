"""orion.tokenizers.gpt2 against OpenAI's encoder (encoder.json + vocab.bpe)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from orion.errors import ModelLoadError
from orion.tokenizers.gpt2 import ASSET, GPT2Tokenizer
from tokenizer.bpe_reference import ReferenceEncoder

TEXTS = [
    "Hello world",
    "Hello, world! How's it going? I'd say we'll've done it; they're here.",
    "naïve café Ünïcödé façade — “quotes” and ‘single’ … ellipsis",
    "日本語のテキストと中文字符和한국어",
    "Здравствуй, мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם",
    "emoji 🎉🎉 👩‍👩‍👧‍👦 🇫🇷 ❤️ 🤖 and a lone 🦀",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs\nnewlines\n\n\nand\r\nCRLF \n \n",
    "many     spaces      between       words",
    "digits 0 12 345 6789 1234567890 3.14159 1,000,000 0x1F 1e-5",
    "<|endoftext|>",
    "before<|endoftext|>after <|endoftext|> <|endoftext|><|endoftext|>",
    "code: def f(x):\n    return x ** 2  # comment\n",
    "URL https://example.com/path?q=1&r=2#frag and mail@example.org",
    "'s 't 're 've 'm 'll 'd 'S 'T don't won't y'all",
    "\u00a0non-breaking\u2009thin\u200bzero-width\ufeffBOM",
    "combining e\u0301 and precomposed é, control \x00\x01\x1f chars",
    "",
    " ",
    "\n",
]


@pytest.fixture(scope="module")
def reference(gpt2_files: Path) -> ReferenceEncoder:
    return ReferenceEncoder.from_files(gpt2_files / "encoder.json", gpt2_files / "vocab.bpe")


@pytest.fixture(scope="module")
def tok() -> GPT2Tokenizer:
    return GPT2Tokenizer.default()


def random_texts(n: int, seed: int = 0) -> list[str]:
    """Random strings over a mixed alphabet: ASCII, whitespace runs, digits, accents,
    CJK, emoji, the special token."""
    rng = random.Random(seed)
    pieces = list("abcXYZ019 '\t\n.,!-") + ["  ", "   ", "\n\n", "é", "ß", "中", "🎉", "👍🏽",
                                           "<|endoftext|>", "'s", "123", "\u200d"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def test_the_shipped_ranks_file_is_in_the_package():
    assert ASSET.is_file()
    assert ASSET.parent.name == "assets" and ASSET.parent.parent.name == "orion"


def test_known_ids(tok):
    assert tok.encode("Hello") == [15496]
    assert tok.encode("<|endoftext|>") == [50256]
    assert tok.eos_token_id == 50256
    assert tok.vocab_size == 50257


@pytest.mark.parametrize("text", TEXTS)
def test_encodings_match_openai_encoder(tok, reference, text):
    assert tok.encode(text) == reference.encode(text)
    assert tok.encode(text, allow_special=False) == reference.encode_ordinary(text)


def test_random_texts_match_openai_encoder(tok, reference):
    for text in random_texts(300):
        assert tok.encode(text) == reference.encode(text), repr(text)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, reference, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert reference.decode(ids) == text


def test_decode_bytes_cuts_inside_characters(tok):
    ids = tok.encode("🎉")
    assert len(ids) > 1  # one emoji, several byte-level tokens
    parts = [tok.decode_bytes([i]) for i in ids]
    assert b"".join(parts) == "🎉".encode()
    assert tok.decode(ids[:1]).endswith("\ufffd")


def test_unknown_id_is_an_error(tok):
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.decode([50257])


def test_built_from_openai_files_equals_shipped(gpt2_files, tok):
    own = GPT2Tokenizer.from_folder(gpt2_files)
    assert own is not None
    for text in TEXTS + random_texts(50, seed=1):
        assert own.encode(text) == tok.encode(text)


def write_tiny_bpe(folder: Path, shuffle: bool) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A small byte-level BPE (256 bytes + a few merges); with `shuffle` its ids are
    not in merge order, as a BPE trained elsewhere may be."""
    from tokenizer.bpe_reference import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"),
              ("o", "r"), ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld")]
    tokens = chars + [a + b for a, b in merges] + ["<|endoftext|>"]
    ids = list(range(len(tokens)))
    if shuffle:
        random.Random(3).shuffle(ids)
    vocab = dict(zip(tokens, ids, strict=True))
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return vocab, merges


@pytest.mark.parametrize("shuffle", [False, True])
def test_model_folder_tokenizer_takes_precedence(tmp_path, shuffle):
    vocab, merges = write_tiny_bpe(tmp_path, shuffle)
    reference = ReferenceEncoder(vocab, merges)
    own = GPT2Tokenizer.for_model(tmp_path)
    for text in ["hello world", "Hello, world!<|endoftext|>hell", "héllo 🎉 wor ld"]:
        assert own.encode(text) == reference.encode(text)
        assert own.decode(own.encode(text)) == text
    assert own.encode("hello world") != GPT2Tokenizer.default().encode("hello world")
    assert own.eos_token_id == vocab["<|endoftext|>"]


def test_folder_without_tokenizer_files_gets_gpt2(tmp_path):
    assert GPT2Tokenizer.for_model(tmp_path).encode("Hello") == [15496]


def test_tokenizer_json(tmp_path, gpt2_files):
    vocab = json.loads((gpt2_files / "encoder.json").read_text(encoding="utf-8"))
    lines = (gpt2_files / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    spec = {"model": {"type": "BPE", "vocab": vocab, "merges": [m for m in lines if m]},
            "added_tokens": [{"id": 50256, "content": "<|endoftext|>"}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    own = GPT2Tokenizer.from_folder(tmp_path)
    assert own is not None
    assert own.encode(TEXTS[5]) == GPT2Tokenizer.default().encode(TEXTS[5])


def test_merge_of_unknown_token_is_an_error(tmp_path):
    write_tiny_bpe(tmp_path, shuffle=False)
    with (tmp_path / "merges.txt").open("a", encoding="utf-8") as f:
        f.write("x y\n")
    with pytest.raises(ModelLoadError, match="vocabulary lacks"):
        GPT2Tokenizer.from_folder(tmp_path)
