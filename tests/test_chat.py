"""orion.chat: a model's own chat template, or the documented fallback."""

from __future__ import annotations

import pytest
from asset_paths import require_asset

import orion
from orion.chat import FALLBACK_STOPS, chat_format
from orion.models import default_model_path
from orion.tokenizers import load_tokenizer

CHAT = [{"role": "system", "content": "A street in Verona."},
        {"role": "user", "content": "Who goes there?"},
        {"role": "assistant", "content": "A friend."},
        {"role": "user", "content": "Speak, friend."}]


def test_fallback_template_for_the_shipped_model():
    fmt = chat_format(load_tokenizer(default_model_path()))
    assert fmt.fallback and fmt.stops == FALLBACK_STOPS
    text = fmt.template.render(CHAT, add_generation_prompt=True)
    assert text == ("A street in Verona.\n\nUSER:\nWho goes there?\n\nASSISTANT:\nA friend."
                    "\n\nUSER:\nSpeak, friend.\n\nASSISTANT:\n")
    assert fmt.prompt_ids(CHAT) == fmt.tokenizer.encode(text)


@pytest.mark.slow
def test_fallback_answer_ends_at_a_blank_line():
    model, tok = orion.load(default_model_path())
    try:
        fmt = chat_format(tok)
        out = orion.generate(model, fmt.prompt_ids(CHAT[:2]), max_tokens=80,
                             stop=list(fmt.stops), temperature=0.8, seed=1)
        assert "\n\n" not in out
    finally:
        model.close()


def test_own_template_is_used():
    transformers = pytest.importorskip("transformers")
    folder = require_asset("tokenizers/qwen2")
    fmt = chat_format(load_tokenizer(folder))
    assert not fmt.fallback and fmt.stops == ()
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert fmt.prompt_ids(CHAT) == theirs.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
