"""`orion generate --model PATH "prompt"` streams the continuation; --stats reports."""

from __future__ import annotations

import io

import pytest
from models.conftest import TINY, save_peaked_gpt2

import orion
from orion.cli import main

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_peaked_gpt2(tmp_path_factory.mktemp("gpt2_cli"), TINY)


def test_streams_the_same_text_as_the_api(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "Hello world", "--max-tokens", "12",
                 "--stats"]) == 0
    captured = capsys.readouterr()
    model, _ = orion.load(model_dir)
    try:
        expected = orion.generate(model, "Hello world", max_tokens=12)
    finally:
        model.close()
    assert captured.out == expected + "\n"
    assert "prefill" in captured.err and "tokens/s" in captured.err
    assert "programs compiled" in captured.err and "cache hits" in captured.err


def test_sampling_flags_and_seed(model_dir, capsys):
    args = ["generate", "-m", str(model_dir), "Hi", "--max-tokens", "8", "--temperature",
            "3", "--top-k", "40", "--top-p", "0.9", "--seed", "5", "--backend", "vane"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first


def test_prompt_from_stdin(model_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello world"))
    assert main(["generate", "--model", str(model_dir), "--max-tokens", "12"]) == 0
    from_stdin = capsys.readouterr().out
    assert main(["generate", "--model", str(model_dir), "Hello world", "--max-tokens",
                 "12"]) == 0
    assert capsys.readouterr().out == from_stdin


def test_missing_model_is_an_error(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope"), "x"]) == 2  # one line, exit 2
    assert "no model at" in capsys.readouterr().err


def test_without_model_runs_the_shipped_model(capsys):
    """A fresh install generates with no download: the default is the shipped Llama."""
    from orion.models import default_model_path

    assert (default_model_path() / "model.safetensors").is_file()
    assert main(["generate", "ROMEO:", "--max-tokens", "24", "--seed", "1",
                 "--temperature", "0.8"]) == 0
    text = capsys.readouterr().out
    assert len(text.strip()) > 20
    assert any(ch.isalpha() for ch in text)


def test_no_prompt_on_a_terminal_is_an_error(capsys, monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty())
    assert main(["generate"]) == 2
    assert "give a prompt" in capsys.readouterr().err


def test_max_tokens_beyond_the_context_says_it_was_cut(tmp_path_factory, capsys):
    short = save_peaked_gpt2(tmp_path_factory.mktemp("gpt2_ctx64"),
                             {**TINY, "n_positions": 64})
    capsys.readouterr()       # transformers' save progress
    assert main(["generate", "-m", str(short), "Hi", "--max-tokens", "100"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("orion generate: output cut at the model's context (64 tokens)")
    assert "--max-tokens asked for 100" in err
    assert main(["generate", "-m", str(short), "Hi", "--max-tokens", "5"]) == 0
    assert "cut" not in capsys.readouterr().err


@pytest.mark.parametrize("error", [ValueError, orion.EvalError])
def test_error_mid_stream_starts_its_own_line(model_dir, capsys, monkeypatch, error):
    def failing(*args, **kwargs):
        yield orion.GenerationResponse("partial text", 1)
        raise error("token ids must be in range")

    monkeypatch.setattr(orion, "stream_generate", failing)
    assert main(["generate", "-m", str(model_dir), "Hi"]) != 0
    captured = capsys.readouterr()
    assert captured.out == "partial text\n"
    assert captured.err.startswith("orion generate: error: ")
    assert "token ids must be in range" in captured.err
