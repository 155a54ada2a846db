"""orion.tokenizers: which tokenizer a folder gets, and bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from asset_paths import require_asset

from orion.errors import ModelLoadError
from orion.tokenizers import load_tokenizer
from orion.tokenizers.base import PromptTextError
from orion.tokenizers.gpt2 import GPT2Tokenizer
from orion.tokenizers.hf import HFTokenizer
from orion.tokenizers.sentencepiece import SentencePieceTokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "orion" / "assets" / "shakespeare-llama"


@pytest.mark.slow
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
