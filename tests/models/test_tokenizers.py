"""orion.models.tokenizers: which tokenizer a folder gets, and bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from asset_paths import require_asset

from orion.models.base import ModelLoadError
from orion.models.tokenizer_gpt2 import GPT2Tokenizer
from orion.models.tokenizer_hf import HFTokenizer
from orion.models.tokenizer_sp import SentencePieceTokenizer
from orion.models.tokenizers import PromptTextError, load_tokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "orion" / "assets" / "shakespeare-llama"


def test_picks_by_files(tmp_path):
    assert load_tokenizer(tmp_path) is None
    assert isinstance(load_tokenizer(require_asset("tokenizers/qwen2")), HFTokenizer)
    assert isinstance(load_tokenizer(SHIPPED), SentencePieceTokenizer)
    gpt2 = require_asset("gpt2")
    assert isinstance(load_tokenizer(gpt2), GPT2Tokenizer)
    # tokenizer.json wins over tokenizer.model, as in transformers
    shutil.copy(SHIPPED / "tokenizer.model", tmp_path)
    shutil.copy(require_asset("tokenizers/qwen2/tokenizer.json"), tmp_path)
    assert isinstance(load_tokenizer(tmp_path), HFTokenizer)


def test_sentencepiece_folder_gets_template_and_end_tokens(tmp_path):
    shutil.copy(SHIPPED / "tokenizer.model", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}"
                          "{% endfor %}"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    tok = load_tokenizer(tmp_path)
    assert tok.eos_token_ids == (2, 7)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<s>hi</s>"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True) == \
        tok.encode("<s>hi</s>")


def test_corrupt_tokenizer_model_names_the_file(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="tokenizer.model"):
        load_tokenizer(tmp_path)


def test_fifo_tokenizer_json_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "tokenizer.json")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        load_tokenizer(tmp_path)


def test_lone_surrogate_on_sentencepiece():
    with pytest.raises(PromptTextError, match="character 1"):
        load_tokenizer(SHIPPED).encode("a\udcff")


def _word_level_tokenizer_json(folder: Path, size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))


def test_llama_folder_with_tokenizer_json_uses_it(tmp_path):
    import orion

    for name in ("config.json", "model.safetensors"):
        shutil.copy(SHIPPED / name, tmp_path)
    _word_level_tokenizer_json(tmp_path, 2048)
    model, tok = orion.load(tmp_path)
    try:
        assert isinstance(tok, HFTokenizer) and tok.eos_token_ids == (1,)
        assert tok.encode("w5 w6") == [5, 6]
        out = orion.generate(model, "w5 w6", max_tokens=3)
        assert all(w.startswith("w") or w == "<unk>" for w in out.split())
    finally:
        model.close()
    _word_level_tokenizer_json(tmp_path, 4096)
    with pytest.raises(ModelLoadError, match="4096 tokens, the model 2048"):
        orion.load(tmp_path)


def test_gpt2_folder_with_tokenizer_json_uses_it(tmp_path, tiny_gpt2_dir, gpt2_files):
    """A GPT-2 folder as transformers saves it (tokenizer.json beside the model) loads
    its tokenizer.json, and encodes as GPT-2's tiktoken path does."""
    from tokenizers import ByteLevelBPETokenizer

    from orion.models.base import load_model

    for f in tiny_gpt2_dir.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    fast = ByteLevelBPETokenizer.from_file(str(gpt2_files / "encoder.json"),
                                           str(gpt2_files / "vocab.bpe"))
    fast.add_special_tokens(["<|endoftext|>"])
    fast.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    for extra in ("vocab.json", "merges.txt"):   # only tokenizer.json remains
        (tmp_path / extra).unlink(missing_ok=True)
    model = load_model(tmp_path)
    try:
        tok = model.tokenizer
        assert isinstance(tok, HFTokenizer) and tok.eos_token_ids == (50256,)
        text = "Hello  world<|endoftext|> naïve 🤗\n\n  x"
        assert tok.encode(text) == GPT2Tokenizer.default().encode(text)
    finally:
        model.close()
