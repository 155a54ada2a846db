"""orion.tokenizers.chat_template against transformers' apply_chat_template: the shared
Llama 3 and Qwen2 templates, and templates written here for the edge cases."""

from __future__ import annotations

import json
import shutil

import pytest
from asset_paths import require_asset

from orion.tokenizers.chat_template import ChatTemplate, ChatTemplateError
from orion.tokenizers.hf import HFTokenizer

CHATS = {
    "single": [{"role": "user", "content": "Hello! 你好 🤗"}],
    "system": [{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "What is 2+2?"}],
    "multi": [{"role": "system", "content": "Be kind."},
              {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello, how can I help?"},
              {"role": "user", "content": "Tell me a <|eot_id|> joke\n\n  with spaces"}],
    "none_content": [{"role": "user", "content": "x", "name": None}],
}

# templates written here for the edge cases (jinja features transformers' env enables)
EDGE = {
    "system_first": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
        "{% set sys = messages[0]['content'] %}{% set rest = messages[1:] %}"
        "{% else %}{% set sys = 'default system' %}{% set rest = messages %}{% endif %}"
        "<<SYS>>{{ sys }}<</SYS>>\n"
        "{% for m in rest %}{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]"
        "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"),
    "loop_controls": (
        "{% set ns = namespace(n=0) %}"
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{{ ns.n }}:{{ m.role }}={{ m | tojson }}\n"
        "{% if loop.index > 3 %}{% break %}{% endif %}{% endfor %}"
        "{{ dict(a=1) | tojson }}{% if add_generation_prompt %}>{% endif %}"),
    "whitespace": (
        "  {% for m in messages %}\n    {{ m['role'] }}: {{ m['content'] }}\n"
        "  {% endfor %}\n{%- if add_generation_prompt -%}\n  assistant:\n{%- endif %}"),
    "generation_tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|"
        "{% endfor %}"),
}
RAISES = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
          "{{ raise_exception('Only user and assistant roles are supported!') }}"
          "{% endif %}{{ m['content'] }}{% endfor %}")


def _folder(tmp_path, name, template=None):
    src = require_asset(f"tokenizers/{name}")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    if template is not None:
        (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
    return tmp_path


@pytest.fixture(scope="module", params=["llama3", "qwen2"])
def pair(request):
    """(ours, transformers') for a shared folder, loaded once: AutoTokenizer is slow."""
    transformers = pytest.importorskip("transformers")
    folder = require_asset(f"tokenizers/{request.param}")
    return HFTokenizer.from_folder(folder), transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.slow
@pytest.mark.parametrize("chat", sorted(CHATS))
@pytest.mark.parametrize("gen", [True, False])
def test_shared_templates_equal_transformers(pair, chat, gen):
    ours, theirs = pair
    messages = CHATS[chat]
    text = ours.apply_chat_template(messages, add_generation_prompt=gen)
    assert text == theirs.apply_chat_template(messages, add_generation_prompt=gen,
                                              tokenize=False)
    ids = ours.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)
    assert ids == theirs.apply_chat_template(messages, add_generation_prompt=gen,
                                             tokenize=True, return_dict=False)


def _with_template(ours, source):
    return ChatTemplate(source, origin="test", special_tokens=ours.special_tokens)


@pytest.mark.parametrize("edge", sorted(EDGE))
@pytest.mark.parametrize("chat", sorted(CHATS))
def test_edge_templates_equal_transformers(pair, edge, chat):
    ours, theirs = pair
    for gen in (True, False):
        assert _with_template(ours, EDGE[edge]).render(CHATS[chat], add_generation_prompt=gen) \
            == theirs.apply_chat_template(CHATS[chat], add_generation_prompt=gen,
                                          tokenize=False, chat_template=EDGE[edge])


def test_template_in_tokenizer_config(tmp_path, pair):
    ours_shared, theirs = pair
    folder = _folder(tmp_path, "qwen2")
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = EDGE["system_first"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours = HFTokenizer.from_folder(folder)
    ours.chat_template.special_tokens = ours_shared.special_tokens
    assert ours.apply_chat_template(CHATS["multi"]) == theirs.apply_chat_template(
        CHATS["multi"], add_generation_prompt=True, tokenize=False,
        chat_template=EDGE["system_first"])


def test_named_templates_use_default(tmp_path):
    folder = _folder(tmp_path, "qwen2")
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"},
                               {"name": "default", "template": "{{ messages[0].content }}!"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert HFTokenizer.from_folder(folder).apply_chat_template(CHATS["single"]) == \
        "Hello! 你好 🤗!"
    config["chat_template"] = [{"name": "a", "template": "A"}, {"name": "b", "template": "B"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match="none is 'default'"):
        HFTokenizer.from_folder(folder)


def test_a_template_that_raises(tmp_path, pair):
    import jinja2

    _, theirs = pair
    with pytest.raises(jinja2.exceptions.TemplateError, match="Only user and assistant"):
        theirs.apply_chat_template(CHATS["system"], tokenize=False, chat_template=RAISES)
    ours = HFTokenizer.from_folder(_folder(tmp_path, "llama3", RAISES))
    with pytest.raises(ChatTemplateError, match="chat_template.jinja.*Only user and assistant"):
        ours.apply_chat_template(CHATS["system"])
    assert ours.apply_chat_template(CHATS["single"]) == "Hello! 你好 🤗"


@pytest.mark.parametrize("template,what", [
    ("{% for m in messages %}", "does not compile"),
    ("{{ messages[0].__class__.__mro__ }}", "failed"),           # the sandbox
    ("{{ ''.__class__ }}{{ cycler.__init__.__globals__ }}", "failed"),
    ("{{ messages[5]['content'] }}", "failed"),
    ("{{ 1 / 0 }}", "failed"),
    ("{% set ns = namespace(_x=1) %}", "failed"),
])
def test_bad_templates_are_clear_errors(template, what):
    with pytest.raises(ChatTemplateError, match=what):
        ChatTemplate(template, origin="x/chat_template.jinja").render(CHATS["single"])


def test_no_template_and_bad_messages(tmp_path):
    folder = _folder(tmp_path, "qwen2")
    (folder / "chat_template.jinja").unlink()
    tok = HFTokenizer.from_folder(folder)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template(CHATS["single"])
    (folder / "chat_template.jinja").write_text(EDGE["whitespace"])
    tok = HFTokenizer.from_folder(folder)
    for bad in ([], "hi", ["hi"], None):
        with pytest.raises(ValueError):
            tok.apply_chat_template(bad)


def test_unreadable_template_file_names_it(tmp_path):
    folder = _folder(tmp_path, "qwen2")
    (folder / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff\xfe")
    with pytest.raises(ChatTemplateError, match="chat_template.jinja: not UTF-8"):
        HFTokenizer.from_folder(folder)
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").symlink_to("/etc/hostname")
    with pytest.raises(ChatTemplateError, match="outside"):
        HFTokenizer.from_folder(folder)
