"""The server on a model whose folder has a real tokenizer.json and chat template
(Llama 3's, on a small random Llama): the prompt the server builds is token for
token transformers' apply_chat_template. (That generation stops on any end token is
tested in tests/test_generate.py: random weights never choose one.)"""

from __future__ import annotations

import json
import shutil

import pytest
from asset_paths import require_asset
from models.llama_args import llama

from orion.models.weights import init_weights, save_folder

from .conftest import Server

openai = pytest.importorskip("openai")

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello! 你好"}]


@pytest.fixture(scope="module")
def llama3_folder(tmp_path_factory):
    tok = require_asset("tokenizers/llama3")
    folder = tmp_path_factory.mktemp("llama3-small")
    arch = llama(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=128257,
                 hidden_dim=128, max_seq_len=128)
    save_folder(folder, arch, init_weights(arch, seed=0))
    for f in tok.iterdir():
        shutil.copy(f, folder / f.name)
    # Llama 3.x Instruct's end tokens: the text's and the turn's
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [128001, 128008, 128009]}))
    return folder


@pytest.mark.slow
def test_chat_prompt_is_transformers_apply_chat_template(llama3_folder):
    transformers = pytest.importorskip("transformers")
    expected = transformers.AutoTokenizer.from_pretrained(llama3_folder).apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    server = Server("--model", str(llama3_folder)).wait_ready()
    try:
        client = server.client(timeout=120)
        out = client.chat.completions.create(model=llama3_folder.name, messages=CHAT,
                                             max_tokens=6, temperature=0)
        assert out.usage.prompt_tokens == len(expected)
        # the prompt ids themselves: the same prompt as token ids to /v1/completions
        # gives the same greedy text
        same = client.completions.create(model=llama3_folder.name, prompt=expected,
                                         max_tokens=6, temperature=0)
        assert same.choices[0].text == out.choices[0].message.content
        assert same.usage.prompt_tokens == len(expected)
    finally:
        assert "Traceback" not in server.stop()
