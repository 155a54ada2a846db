"""Class 15: data files read by the lines JSON agrees with, with bounds. train.jsonl was
split with str.splitlines, so a JSON string holding a raw U+2028 (valid JSON) was
refused as "not valid JSON"; a line with a 5,000-digit integer was an "unexpected
exception"; a 2 GB single-line file grew memory without a bound (read whole, decoded,
split, handed to the tokenizer at once). Lines now split at "\\n" only, each at most
16 MiB (refused before it is read whole), parsed with bounded integers; `orion train`
hands its tokenizer bounded pieces of a corpus."""

from __future__ import annotations

import json

import pytest

from hostile.helpers import shipped_model, write_gpt2_folder
from orion.errors import OrionError


@pytest.fixture(scope="module")
def tokenizer():
    from orion.tokenizers import load_tokenizer

    return load_tokenizer(shipped_model())


def _folder(tmp_path, train: bytes, valid: bytes = b'{"text": "fair Verona"}\n'):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(train)
    (folder / "valid.jsonl").write_bytes(valid)
    return folder


def _load(folder, tokenizer):
    from orion.lora.data import load_folder

    return load_folder(folder, tokenizer, 64)


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_raw_line_separator_inside_a_json_string_is_text(tmp_path, tokenizer, separator):
    line = '{"text": "two households' + separator + 'both alike in dignity"}'
    data = _load(_folder(tmp_path, (line + "\r\n" + line + "\n").encode()), tokenizer)
    assert len(data["train"].examples) == 2
    assert data["train"].examples[0].ids == data["train"].examples[1].ids


@pytest.mark.parametrize(("body", "reason"), [
    ('{"text": "a", "n": ' + "1" * 5000 + "}", "5000 digits"),
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"text": "a"', "not valid JSON"),
])
def test_a_bad_line_is_an_error_naming_it(tmp_path, tokenizer, body, reason):
    folder = _folder(tmp_path, b'{"text": "fine"}\n' + body.encode() + b"\n")
    with pytest.raises(OrionError, match=f"train.jsonl, line 2: .*{reason}"):
        _load(folder, tokenizer)


def test_a_line_past_the_bound_is_refused_before_it_is_read(tmp_path, tokenizer, monkeypatch):
    """The bound, shrunk to 4 KiB here (16 MiB by default): a 1 MiB line is refused
    after 1 MiB is read, never decoded or parsed whole."""
    import orion.lora.data as data

    monkeypatch.setattr(data, "MAX_LINE_BYTES", 4096)
    line = json.dumps({"text": "x" * (1 << 20)}).encode()
    folder = _folder(tmp_path, b'{"text": "ok"}\n' + line + b"\n")
    with pytest.raises(OrionError, match="train.jsonl: line 2 is longer than"):
        _load(folder, tokenizer)


def test_a_single_line_corpus_reaches_the_tokenizer_in_bounded_pieces(tmp_path,
                                                                       monkeypatch):
    import orion.train.data as data
    from orion.tokenizers import load_tokenizer

    monkeypatch.setattr(data, "CHUNK_BYTES", 4096)
    tok = load_tokenizer(shipped_model())
    seen = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text: seen.append(len(text)) or encode(text))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("but soft what light through yonder window breaks " * 4000)  # 1 line
    data.tokenize_file(corpus, tok, tmp_path / "train.tokens")
    assert len(seen) > 40 and max(seen) <= 4096


def test_a_5000_digit_integer_in_config_json_is_a_model_load_error(tmp_path):
    import orion

    folder = write_gpt2_folder(tmp_path / "m")
    text = (folder / "config.json").read_text().replace('"n_layer": 1', '"n_layer": '
                                                                      + "1" * 5000)
    (folder / "config.json").write_text(text)
    with pytest.raises(OrionError, match="config.json.*5000 digits"):
        model, _ = orion.load(folder)
        model.close()
