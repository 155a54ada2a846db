"""mlx-lm data folders: the three line kinds, masks, truncation, and errors that name
the file and line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orion.lora.config import LoraError
from orion.lora.data import load_folder, load_split
from orion.models.llama import _tokenizer_for, default_model_path


@pytest.fixture(scope="module")
def tok():
    return _tokenizer_for(default_model_path(), 2048)


def write(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return path


def test_text_lines_count_every_token_and_end_with_eos(tmp_path, tok):
    split = load_split(write(tmp_path / "t.jsonl", [{"text": "ROMEO: speak"}]), tok, 100)
    ex = split.examples[0]
    assert ex.ids == tok.encode("ROMEO: speak") + [tok.eos_token_id]
    assert ex.mask == [1] * (len(ex.ids) - 1)


def test_prompt_completion_masks_the_prompt(tmp_path, tok):
    line = {"prompt": "Who comes here?", "completion": " A friend."}
    ex = load_split(write(tmp_path / "t.jsonl", [line]), tok, 100).examples[0]
    p, c = tok.encode("Who comes here?"), tok.encode(" A friend.") + [tok.eos_token_id]
    assert ex.ids == p + c
    # targets ids[1:]: the first counted target is the completion's first token
    assert ex.mask == [0] * (len(p) - 1) + [1] * len(c)
    tokens, targets, mask = load_split(write(tmp_path / "u.jsonl", [line]), tok, 100).batch(
        np.array([0]), 32)
    assert targets[0][mask[0] == 1].tolist() == c


def test_long_examples_are_truncated_and_counted(tmp_path, tok):
    split = load_split(write(tmp_path / "t.jsonl", [{"text": "la " * 200}, {"text": "x"}]),
                       tok, 16)
    assert split.truncated == 1 and len(split.examples[0].ids) == 17
    assert len(split.examples[0].mask) == 16


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: not valid JSON"),
    ({"prompt": "only"}, "line 2: expected a 'text'"),
    ({"text": 3}, "line 2: 'text' is not a string"),
    ([1, 2], "line 2: not a JSON object"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "line 2: a 'messages' line needs"),
    ({"messages": "hi"}, "line 2: a 'messages' line needs"),
])
def test_a_malformed_line_names_the_file_and_line(tmp_path, tok, line, message):
    path = write(tmp_path / "train.jsonl", [{"text": "fine"}, line])
    with pytest.raises(LoraError, match=message) as info:
        load_split(path, tok, 64)
    assert str(path) in str(info.value)


def test_folder_needs_train_and_valid(tmp_path, tok):
    write(tmp_path / "train.jsonl", [{"text": "a b"}])
    with pytest.raises(LoraError, match="no valid.jsonl"):
        load_folder(tmp_path, tok, 64)
    write(tmp_path / "valid.jsonl", [{"text": "c d"}])
    assert set(load_folder(tmp_path, tok, 64)) == {"train", "valid"}
    write(tmp_path / "test.jsonl", [{"text": "e f"}])
    assert set(load_folder(tmp_path, tok, 64)) == {"train", "valid", "test"}


class ChatTok:
    """The shipped tokenizer with a chat template of our own, rendered in Python: the
    masking is what is tested here (templates are orion.models.chat_template's)."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size, self.eos_token_id = tok.vocab_size, tok.eos_token_id

    def encode(self, text):
        return self.tok.encode(text)

    def decode(self, ids):
        return self.tok.decode(ids)

    def apply_chat_template(self, messages, *, add_generation_prompt=True, tokenize=False):
        text = "".join(f"[{m['role']}] {m['content']}\n" for m in messages)
        text += "[assistant]" if add_generation_prompt else ""
        return self.tok.encode(text) if tokenize else text


def test_messages_count_assistant_turns_only(tmp_path, tok):
    chat = ChatTok(tok)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hail."}, {"role": "user", "content": "Who?"},
            {"role": "assistant", "content": "A friend."}]
    ex = load_split(write(tmp_path / "t.jsonl", [{"messages": msgs}]), chat, 200).examples[0]
    assert ex.ids == chat.apply_chat_template(msgs, add_generation_prompt=False, tokenize=True)
    counted = tok.decode([t for t, m in zip(ex.ids[1:], ex.mask, strict=True) if m])
    assert "Hail." in counted and "A friend." in counted
    assert "Who" not in counted and "brief" not in counted and "user" not in counted
    with pytest.raises(LoraError, match="line 1: no assistant turn"):
        load_split(write(tmp_path / "u.jsonl", [{"messages": msgs[:2]}]), chat, 200)
