"""Class 11: tokenizer files. tokenizer.json settings that would change ids silently
are turned off with a warning (truncation.max_length 1 cut every prompt to one token;
a BPE dropout of 0.9 made tokenization random), a Split regex that makes the
tokenizers library panic (a BaseException: a traceback and exit 1) is a typed error,
generation_config.json's sampling defaults are checked when the model loads (a NaN or
negative temperature made every request that used them a 500), and a vocab.json id
of 2^63+5 is a ModelLoadError, not an OverflowError."""

from __future__ import annotations

import json
import logging
import math

import pytest

from hostile.helpers import (
    GPT2_TINY,
    assert_one_line_error,
    run_cli,
    write_gpt2_folder,
    write_tokenizer_json,
)
from orion.errors import ModelLoadError, OrionError

TEXT = "hello the world, then the other one"


def _load(folder):
    from orion.tokenizers import load_tokenizer

    return load_tokenizer(folder)


def test_truncation_and_padding_are_turned_off_with_a_warning(tmp_path, caplog):
    plain = _load(write_tokenizer_json(tmp_path / "plain")).encode(TEXT)
    folder = write_tokenizer_json(
        tmp_path / "t", truncation={"direction": "Right", "max_length": 1, "strategy":
                                    "LongestFirst", "stride": 0},
        padding={"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of":
                 None, "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"})
    with caplog.at_level(logging.WARNING):
        tok = _load(folder)
    assert tok.encode(TEXT) == plain and len(plain) > 1
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "truncation" in warned and "padding" in warned


def test_bpe_dropout_is_turned_off_with_a_warning(tmp_path, caplog):
    plain = _load(write_tokenizer_json(tmp_path / "plain")).encode(TEXT)
    with caplog.at_level(logging.WARNING):
        tok = _load(write_tokenizer_json(tmp_path / "d", model_change={"dropout": 0.9}))
    assert all(tok.encode(TEXT) == plain for _ in range(20))
    assert "dropout" in " ".join(r.getMessage() for r in caplog.records)


CATASTROPHIC_SPLIT = {"type": "Split", "pattern": {"Regex": "(a|aa)+b"},
                      "behavior": "Isolated", "invert": False}


def test_a_split_regex_that_panics_is_a_typed_error(tmp_path):
    tok = _load(write_tokenizer_json(tmp_path / "s", pre_tokenizer=CATASTROPHIC_SPLIT))
    with pytest.raises(OrionError, match="tokenizer.json"):
        tok.encode("a" * 40 + "!")
    assert tok.encode("ab") == tok.encode("ab")    # the tokenizer is still usable


def test_generate_through_a_panicking_tokenizer_ends_with_one_error_line(tmp_path, capsys):
    """The Rust library prints its own panic message to the process's stderr (fd 2)
    before it unwinds, which Orion cannot withhold; Orion's part is one line and no
    Python traceback."""
    folder = write_tokenizer_json(write_gpt2_folder(tmp_path / "m"),
                                  pre_tokenizer=CATASTROPHIC_SPLIT)
    rc, _, err = run_cli(["generate", "--model", str(folder), "a" * 40 + "!",
                          "--max-tokens", "2"], capsys)
    assert "tokenizers library failed" in assert_one_line_error(rc, err, "generate")


def _gpt2_with_generation(folder, generation):
    write_tokenizer_json(write_gpt2_folder(folder))
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


@pytest.mark.parametrize("generation", [
    {"temperature": math.nan}, {"temperature": -5}, {"temperature": math.inf},
    {"top_p": 0}, {"top_p": 1.5}, {"top_k": -1}, {"top_k": 2.5},
    {"repetition_penalty": 0}, {"do_sample": "yes"}, {"max_new_tokens": -1}])
def test_generation_config_is_checked_when_the_model_loads(tmp_path, generation):
    import orion

    folder = _gpt2_with_generation(tmp_path / "m", generation)
    field = next(iter(generation))
    with pytest.raises(OrionError, match=f"generation_config.json.*{field}"):
        model, _ = orion.load(folder)
        model.close()


def test_sane_generation_defaults_still_load(tmp_path):
    import orion

    folder = _gpt2_with_generation(tmp_path / "m", {"temperature": 0.6, "top_p": 0.9,
                                                    "top_k": 20, "do_sample": True})
    model, tok = orion.load(folder)
    model.close()
    assert tok.generation_defaults["temperature"] == 0.6


@pytest.mark.parametrize("bad_id", [2**63 + 5, -1, 2**31])
def test_a_vocab_json_id_out_of_range_is_a_model_load_error(tmp_path, bad_id):
    import orion

    folder = write_gpt2_folder(tmp_path / "m", {**GPT2_TINY})
    from orion.tokenizers.gpt2 import byte_decoder

    vocab = {ch: i for i, ch in enumerate(sorted(byte_decoder(), key=byte_decoder().get))}
    vocab["<|endoftext|>"] = bad_id
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ModelLoadError, match="vocab.json"):
        model, _ = orion.load(folder)
        model.close()
