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


@pytest.mark.slow
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


@pytest.mark.slow
def test_sampling_flags_and_seed(model_dir, capsys):
    args = ["generate", "-m", str(model_dir), "Hi", "--max-tokens", "8", "--temperature",
            "3", "--top-k", "40", "--top-p", "0.9", "--seed", "5", "--backend", "vane"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---- chat templates, --system, --prompt-file, --stats on Ctrl-C ---------------------


@pytest.fixture(scope="module")
def instruct_dir(tmp_path_factory):
    """A small random Llama with Qwen's tokenizer and chat template (an instruct model's
    folder); its greedy tokens mean nothing, the prompt it gets is what is tested."""
    import shutil

    from asset_paths import require_asset
    from models.hf_fixtures import PUBLISHED, save_numpy_init

    folder = tmp_path_factory.mktemp("qwen-instruct")
    save_numpy_init(folder, {**PUBLISHED["SmolLM2-135M"], "hidden_size": 64,
                             "intermediate_size": 128, "num_attention_heads": 2,
                             "num_key_value_heads": 1, "num_hidden_layers": 1,
                             "max_position_embeddings": 128, "vocab_size": 151665})
    for f in require_asset("tokenizers/qwen2").iterdir():
        shutil.copy(f, folder / f.name)
    return folder


def _reference_ids(folder, messages):
    """transformers' apply_chat_template: the prompt mlx-lm's generate would send."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False))


def _api_text(folder, prompt, max_tokens):
    model, _ = orion.load(folder)
    try:
        return orion.generate(model, prompt, max_tokens=max_tokens)
    finally:
        model.close()


@pytest.mark.slow
@pytest.mark.parametrize("system", [None, "Answer in one word."])
def test_chat_template_is_applied(instruct_dir, capsys, system):
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": "Hello there"}]
    expected = _reference_ids(instruct_dir, messages)
    args = ["generate", "-m", str(instruct_dir), "Hello there", "--max-tokens", "3", "--stats"]
    assert main(args + (["--system", system] if system else [])) == 0
    captured = capsys.readouterr()
    assert f"prompt {len(expected)} tokens" in captured.err
    assert captured.out == _api_text(instruct_dir, expected, 3) + "\n"


@pytest.mark.slow
def test_ignore_chat_template_sends_the_raw_text(instruct_dir, capsys):
    transformers = pytest.importorskip("transformers")
    raw = transformers.AutoTokenizer.from_pretrained(instruct_dir)("Hello there")["input_ids"]
    assert main(["generate", "-m", str(instruct_dir), "Hello there", "--max-tokens", "3",
                 "--stats", "--ignore-chat-template"]) == 0
    captured = capsys.readouterr()
    assert f"prompt {len(raw)} tokens" in captured.err
    assert captured.out == _api_text(instruct_dir, "Hello there", 3) + "\n"
    assert main(["generate", "-m", str(instruct_dir), "Hi", "--ignore-chat-template",
                 "--system", "x"]) == 2
    assert "--ignore-chat-template sends raw text" in capsys.readouterr().err


def test_system_without_a_template_is_an_error(model_dir, capsys):
    assert main(["generate", "-m", str(model_dir), "Hi", "--system", "Be brief."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orion generate: error: --system needs the model's chat template")
    assert err.count("\n") == 1


@pytest.mark.slow
def test_prompt_file_and_stdin_dash(model_dir, tmp_path, capsys, monkeypatch):
    assert main(["generate", "-m", str(model_dir), "Hello world", "--max-tokens", "6"]) == 0
    expected = capsys.readouterr().out
    (tmp_path / "p.txt").write_text("Hello world", encoding="utf-8")
    assert main(["generate", "-m", str(model_dir), "--prompt-file", str(tmp_path / "p.txt"),
                 "--max-tokens", "6"]) == 0
    assert capsys.readouterr().out == expected
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello world"))
    assert main(["generate", "-m", str(model_dir), "--prompt-file", "-", "--max-tokens",
                 "6"]) == 0
    assert capsys.readouterr().out == expected
    assert main(["generate", "-m", str(model_dir), "x", "--prompt-file", "-"]) == 2
    assert "not both" in capsys.readouterr().err
    # mlx_lm.generate's --prompt / -p: the text itself, never a file's name
    for flag in ("--prompt", "-p"):
        assert main(["generate", "-m", str(model_dir), flag, "Hello world", "--max-tokens",
                     "6"]) == 0
        assert capsys.readouterr().out == expected
    assert main(["generate", "-m", str(model_dir), "x", "--prompt", "y"]) == 2
    assert "give the prompt once" in capsys.readouterr().err
    assert main(["generate", "-m", str(model_dir), "--prompt-file",
                 str(tmp_path / "absent.txt")]) == 2
    assert "absent.txt: no such file" in capsys.readouterr().err


def test_stats_are_printed_on_ctrl_c(model_dir, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        stats = orion.GenerationStats(prompt_tokens=2, generated_tokens=1, prefill_ms=5.0)
        yield orion.GenerationResponse("Hel", 7, stats)
        raise KeyboardInterrupt

    monkeypatch.setattr(orion, "stream_generate", interrupted)
    assert main(["generate", "-m", str(model_dir), "Hi", "--stats"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "Hel\n"
    plan, first, second = captured.err.splitlines()
    assert plan.startswith("loaded in ") and "evals a decode token" in plan
    assert first.startswith("prompt 2 tokens, prefill 5.0 ms") and "generated 1 tokens" in first
    assert first.endswith("finish: interrupted")
    assert second == "orion generate: interrupted"


@pytest.mark.parametrize("stats", [True, False])
def test_ctrl_c_on_the_real_command(stats):
    """SIGINT mid-stream: exit 130, the stats line when asked, no traceback."""
    import signal
    import subprocess
    import sys

    from child_process import OUTSIDE, child_env

    proc = subprocess.Popen(
        [sys.executable, "-m", "orion", "generate", "ROMEO:", "--max-tokens", "250",
         "--temperature", "0.8", "--seed", "0", *(["--stats"] if stats else [])],
        cwd=OUTSIDE, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.read(1)       # text is streaming
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.endswith("orion generate: interrupted\n")
    assert ("finish: interrupted" in err) == stats


@pytest.mark.slow
def test_speculative_flags_print_the_plain_text_and_the_acceptance(model_dir, capsys):
    base = ["generate", "-m", str(model_dir), "a b c d a b c d a b c", "--max-tokens", "16",
            "--backend", "vane"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    for extra in (["--speculative", "prompt", "--draft-tokens", "3"],
                  ["--draft-model", str(model_dir)]):
        assert main([*base, *extra, "--stats"]) == 0
        captured = capsys.readouterr()
        assert captured.out == plain
        assert "speculative:" in captured.err and "drafts accepted" in captured.err
