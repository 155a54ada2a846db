"""A model folder loads the tokenizer it ships (tokenizer.json first, as transformers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import orion
from orion.errors import ModelLoadError
from orion.tokenizers.gpt2 import GPT2Tokenizer
from orion.tokenizers.hf import HFTokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "orion" / "assets" / "shakespeare-llama"


def _word_level_tokenizer_json(folder: Path, size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))


@pytest.mark.slow
def test_llama_folder_with_tokenizer_json_uses_it(tmp_path):

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


@pytest.mark.slow
def test_gpt2_folder_with_tokenizer_json_uses_it(tmp_path, tiny_gpt2_dir, gpt2_files):
    """A GPT-2 folder as transformers saves it (tokenizer.json beside the model) loads
    its tokenizer.json, and encodes as GPT-2's tiktoken path does."""
    from tokenizers import ByteLevelBPETokenizer

    from orion.models import load_model

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
