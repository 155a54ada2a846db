"""mlx-lm data folders: the three line kinds, masks, truncation, and errors that name
the file and line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from asset_paths import require_asset

from orion.errors import LoraError
from orion.lora.data import load_folder, load_split
from orion.models import default_model_path
from orion.models.registry import folder_tokenizer as _tokenizer_for


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
    masking is what is tested here (templates are orion.tokenizers.chat_template's)."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size, self.eos_token_id = tok.vocab_size, tok.eos_token_id
        self.chat_template = "[role] content"   # not None: the folder has a template

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


# ---- real chat templates (Qwen2, Llama 3), against transformers' own rendering ------

CHAT = [{"role": "user", "content": "Hi there, café ☕"},
        {"role": "assistant", "content": "Hail.\nWell met."},
        {"role": "user", "content": "Who comes?"},
        {"role": "assistant", "content": "A friend."}]
WITH_SYSTEM = [{"role": "system", "content": "Be brief."}, *CHAT]


def _hf_ids(hf, messages, generation_prompt):
    out = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                 add_generation_prompt=generation_prompt)
    return list(out["input_ids"])


def _counted(ex):
    """Indices of the tokens the loss counts (target j is token j + 1)."""
    return [j + 1 for j, m in enumerate(ex.mask) if m]


@pytest.fixture(scope="module")
def real_tokenizers():
    """name -> (Orion's tokenizer, transformers' tokenizer) of a real tokenizer folder,
    each loaded once (a missing folder skips, naming it)."""
    transformers = pytest.importorskip("transformers", reason="transformers is the reference")
    from orion.tokenizers import load_tokenizer

    loaded: dict[str, tuple] = {}

    def get(name):
        if name not in loaded:
            folder = require_asset(f"tokenizers/{name}")
            loaded[name] = (load_tokenizer(folder),
                            transformers.AutoTokenizer.from_pretrained(folder))
        return loaded[name]
    return get


@pytest.fixture(scope="module")
def qwen2_folder():
    return require_asset("tokenizers/qwen2")


# each real template's rendering of CHAT's assistant turns, as the loss should count them
TURN_TEXT = {"qwen2": "Hail.\nWell met.<|im_end|>\nA friend.<|im_end|>\n",
             "llama3": "Hail.\nWell met.<|eot_id|>A friend.<|eot_id|>"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TURN_TEXT))
@pytest.mark.parametrize("messages", [CHAT, WITH_SYSTEM], ids=["default-system", "system"])
def test_messages_with_real_templates_mask_what_transformers_prefixes_say(
        tmp_path, real_tokenizers, name, messages):
    orion_tok, hf = real_tokenizers(name)
    ex = load_split(write(tmp_path / "t.jsonl", [{"messages": messages}]), orion_tok,
                    512).examples[0]
    assert ex.ids == _hf_ids(hf, messages, False)
    expect = []
    for k, m in enumerate(messages):
        if m["role"] == "assistant":   # what the turn adds after the generation prompt
            lo = len(_hf_ids(hf, messages[:k], True))
            expect += range(lo, len(_hf_ids(hf, messages[:k + 1], False)))
    assert _counted(ex) == expect
    assert hf.decode([ex.ids[i] for i in expect]) == TURN_TEXT[name]


@pytest.mark.slow
def test_messages_mask_equals_transformers_assistant_tokens_mask(tmp_path, qwen2_folder):
    """Qwen2's template with transformers' `{% generation %}` markers around each
    assistant turn (what follows its '<|im_start|>assistant\\n'): transformers maps the
    marked characters to tokens itself (return_assistant_tokens_mask)."""
    transformers = pytest.importorskip("transformers", reason="transformers is the reference")
    from orion.tokenizers import load_tokenizer

    line = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    template = (qwen2_folder / "chat_template.jinja").read_text()
    assert template.count(line) == 1
    marked = ("{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
              "{% generation %}{{- message.content + '<|im_end|>' + '\\n' }}{% endgeneration %}"
              "{%- else %}" + line + "{%- endif %}")
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen2_folder / name, folder / name)
    (folder / "chat_template.jinja").write_text(template.replace(line, marked))
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    ref = hf.apply_chat_template(WITH_SYSTEM, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    ex = load_split(write(tmp_path / "t.jsonl", [{"messages": WITH_SYSTEM}]),
                    load_tokenizer(folder), 512).examples[0]
    assert ex.ids == list(ref["input_ids"])
    assert _counted(ex) == [i for i, m in enumerate(ref["assistant_masks"]) if m]
    assert sum(ref["assistant_masks"]) > 0


def test_a_chat_opening_with_an_assistant_turn_is_refused(tmp_path, real_tokenizers):
    """Qwen2's template puts a default system prompt and the turn's header before it:
    with no earlier chat to render, those would be counted as the assistant's."""
    path = write(tmp_path / "t.jsonl", [{"messages": CHAT}, {"messages": CHAT[1:]}])
    with pytest.raises(LoraError, match="line 2: the chat opens with an assistant turn"):
        load_split(path, real_tokenizers("qwen2")[0], 512)
