"""orion.tokenizers.hf against transformers.AutoTokenizer on real published
tokenizer folders (Llama 3's 128K BPE, Qwen2's 151K BPE)."""

from __future__ import annotations

import json
import shutil

import pytest
from asset_paths import require_asset

from orion.errors import ModelLoadError
from orion.tokenizers.base import PromptTextError
from orion.tokenizers.hf import HFTokenizer

FOLDERS = ("llama3", "qwen2")
HARD = [
    "",
    " ",
    "   leading and trailing   ",
    "tabs\t\tand\r\nwindows\n\n\n\nnewlines",
    "a" + " " * 37 + "b",
    "\u00a0non-breaking\u2003em space\u3000ideographic",
    "你好，世界。東京は日本の首都です。안녕하세요",
    "emoji 🤗🎉👩‍👩‍👧‍👦 flags 🇫🇷 skin 👍🏽",
    "numbers 1234567890 3.14159 1,000,000",
    "code: def f(x):\n    return x**2  # square",
    "<|begin_of_text|>special <|end_of_text|> in <|eot_id|> text <|endoftext|><|im_start|>",
    "<|im_start|>user\nhi<|im_end|>",
    "naïve café déjà vu — “quotes” ‘single’ … ellipsis",
    "Ǆ ǅ ǆ combining: e\u0301 a\u0308 zero\u200bwidth",
    "'s 't 're 've 'm 'll 'd 'S 'T",
]


@pytest.fixture(scope="module", params=FOLDERS)
def pair(request):
    transformers = pytest.importorskip("transformers")
    folder = require_asset(f"tokenizers/{request.param}")
    return HFTokenizer.from_folder(folder), transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.slow
def test_ids_equal_on_tiny_shakespeare(pair):
    ours, theirs = pair
    text = require_asset("text/tinyshakespeare_input.txt").read_text(encoding="utf-8")
    assert ours.encode(text) == theirs(text)["input_ids"]


@pytest.mark.parametrize("text", HARD)
def test_ids_equal_on_hard_strings(pair, text):
    ours, theirs = pair
    ids = ours.encode(text)
    assert ids == theirs(text)["input_ids"]
    assert ours.decode(ids) == theirs.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids,
                                                                       skip_special_tokens=True)


def test_streaming_bytes_decode_as_transformers(pair):
    """decode_bytes (streaming's exact path) gives the text transformers decodes, token
    by token through orion.generate's streaming detokenizer."""
    from orion.generate import StreamingDetokenizer

    ours, theirs = pair
    text = "\n".join(HARD) + "<|im_end|><|eot_id|>"
    ids = ours.encode(text)
    assert ours.bytes_concatenate
    assert ours.decode_bytes(ids).decode("utf-8") == theirs.decode(ids)
    stream = StreamingDetokenizer(ours)
    pieces = [stream.add(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == theirs.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_special_tokens_and_sizes(pair):
    ours, theirs = pair
    assert ours.vocab_size == len(theirs)
    assert ours.bos_token_id == theirs.bos_token_id
    assert ours.eos_token_id == theirs.eos_token_id
    assert ours.special_tokens == theirs.special_tokens_map


def _copy(name, tmp_path, config_update=None, generation=None):
    src = require_asset(f"tokenizers/{name}")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    if config_update is not None:
        path = tmp_path / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config.update(config_update)
        path.write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


@pytest.mark.slow
def test_post_processor_decides_as_in_transformers(tmp_path):
    """tokenizer.json's post-processor wins over add_bos_token, as in transformers 5."""
    transformers = pytest.importorskip("transformers")
    folder = _copy("llama3", tmp_path, {"add_bos_token": True, "add_eos_token": True})
    ours = HFTokenizer.from_folder(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    for text in ("Hello there", "", "<|eot_id|> x"):
        assert ours.encode(text) == theirs(text)["input_ids"]
        assert ours.encode(text, add_special_tokens=False) == theirs(
            text, add_special_tokens=False)["input_ids"]


@pytest.mark.slow
def test_add_bos_eos_without_a_post_processor(tmp_path):
    folder = _copy("llama3", tmp_path, {"add_bos_token": True, "add_eos_token": True})
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    tok = HFTokenizer.from_folder(folder)
    assert tok.encode("Hello there") == [128000, 9906, 1070, 128001]
    assert tok.encode("Hello there", add_special_tokens=False) == [9906, 1070]


def test_eos_list_from_generation_config(tmp_path):
    # Llama 3.x Instruct's generation_config.json: three end tokens
    folder = _copy("llama3", tmp_path, generation={
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "temperature": 0.6, "top_p": 0.9, "do_sample": True})
    tok = HFTokenizer.from_folder(folder)
    assert tok.eos_token_ids == (128001, 128008, 128009)
    assert tok.eos_token_id == 128001
    assert tok.generation_defaults == {"temperature": 0.6, "top_p": 0.9, "do_sample": True}
    assert tok.encode("<|eot_id|>", add_special_tokens=False) == [128009]


def test_corrupt_tokenizer_json_names_the_file(tmp_path):
    folder = _copy("qwen2", tmp_path)
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 3}}')
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        HFTokenizer.from_folder(folder)
    (folder / "tokenizer.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        HFTokenizer.from_folder(folder)


@pytest.mark.parametrize("content,what", [("{ not json", "not valid JSON"),
                                          ("[1, 2]", "expected a JSON object"),
                                          ('{"eos_token": 5}', "eos_token"),
                                          ('{"eos_token": "<|nope|>"}', "not in")])
def test_bad_tokenizer_config_names_the_file(tmp_path, content, what):
    folder = _copy("qwen2", tmp_path)
    (folder / "tokenizer_config.json").write_text(content)
    with pytest.raises(ModelLoadError, match="tokenizer_config.json") as info:
        HFTokenizer.from_folder(folder)
    assert what in str(info.value)


@pytest.mark.parametrize("eos", [["x"], -1, 10**7, True])
def test_bad_generation_config(tmp_path, eos):
    folder = _copy("qwen2", tmp_path, generation={"eos_token_id": eos})
    with pytest.raises(ModelLoadError, match="generation_config.json: eos_token_id"):
        HFTokenizer.from_folder(folder)


def test_tokenizer_json_outside_the_folder_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "tokenizer.json").symlink_to(require_asset("tokenizers/qwen2/tokenizer.json"))
    with pytest.raises(ModelLoadError, match="outside"):
        HFTokenizer.from_folder(folder)


def test_lone_surrogate_is_a_clear_error(pair):
    ours, _ = pair
    bad = b"caf\xe9 ok".decode("utf-8", errors="surrogateescape")
    with pytest.raises(PromptTextError, match="not valid UTF-8.*character 3"):
        ours.encode(bad)
