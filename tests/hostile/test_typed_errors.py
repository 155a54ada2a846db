"""Class 6: the Python API raises typed Orion errors that name the file and field,
never a raw ZeroDivisionError, TypeError, RecursionError, KeyError, JSONDecodeError,
SafetensorError or sentencepiece RuntimeError."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile.helpers import copy_folder, raw_safetensors
from orion.errors import DataError, ModelLoadError, OrionError

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("field,value", [
    ("n_head", 0), ("n_head", -2), ("n_embd", "64"), ("n_embd", None), ("n_embd", 64.0),
    ("n_layer", True), ("n_layer", [2]), ("vocab_size", {"a": 1}), ("n_positions", -1),
    ("layer_norm_epsilon", "1e-5"), ("layer_norm_epsilon", float("nan")),
    ("activation_function", 3), ("tie_word_embeddings", "yes"), ("n_inner", 0)])
def test_bad_gpt2_config_values_are_model_load_errors(tmp_path, gpt2_dir, field, value):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=field):
        orion.load(folder)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=8)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["n_head", "n_embd", "n_layer", "vocab_size", "n_positions",
                              "n_inner", "layer_norm_epsilon", "activation_function",
                              "tie_word_embeddings", "bos_token_id"]),
       value=JSON_VALUES)
def test_any_gpt2_config_value_loads_or_is_a_model_load_error(tmp_path_factory, gpt2_dir,
                                                              field, value):
    from orion.models.registry import open_hf as load_gpt2_weights

    folder = copy_folder(gpt2_dir, tmp_path_factory.mktemp("m") / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    try:
        load_gpt2_weights(folder)
    except ModelLoadError:
        pass


@pytest.mark.parametrize("name", ["config.json", "vocab.json", "tokenizer.json"])
@pytest.mark.parametrize("text", [DEEP, "{not json", "", "\xff\xfe", "[1, 2]", '{"a": NaN'])
def test_broken_or_deep_json_in_a_model_folder(tmp_path, gpt2_dir, name, text):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    (folder / name).write_bytes(text.encode("utf-8", "surrogateescape")
                                if text != "\xff\xfe" else b"\xff\xfe")
    if name == "vocab.json":
        (folder / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ModelLoadError):
        orion.load(folder)


@pytest.mark.parametrize("spec", [
    {"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}},
    {"model": {"type": "BPE", "vocab": [], "merges": []}},
    {"model": {"type": "BPE", "vocab": {}, "merges": [["a"]]}},
    {"model": {"type": "BPE", "vocab": {}, "merges": 5}},
    {"model": "BPE"},
    {"model": {"type": "BPE", "vocab": {}}, "added_tokens": [{"id": 3}]},
    {"model": {"type": "WordPiece"}},
])
def test_a_malformed_gpt2_tokenizer_json(tmp_path, gpt2_dir, spec):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        orion.load(folder)


@pytest.mark.parametrize("content", [b"", b"\0" * 10, b"garbage" * 100,
                                     b"\x0a\x05hello" * 50])
def test_a_corrupt_safetensors_file(tmp_path, gpt2_dir, content):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        orion.load(folder)


def test_a_model_file_whose_tensors_overlap(tmp_path, gpt2_dir):
    """Two tensors of a model file on the same bytes (the regression of issue 33, there
    for adapters) are refused for model files too, naming the file."""
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    raw = (folder / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    names = [k for k in header if k != "__metadata__" and k.endswith("ln_2.weight")]
    header[names[0]]["data_offsets"] = header[names[0].replace("ln_2", "ln_1")]["data_offsets"]
    (folder / "model.safetensors").write_bytes(raw_safetensors(header, raw[8 + n:]))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors.*overlap|overlap.*model"):
        orion.load(folder)


@pytest.mark.parametrize("content", [b"", b"\0" * 100, b"\x0a\x05hello" * 50,
                                     bytes(range(256)) * 4])
def test_a_corrupt_sentencepiece_model(tmp_path, content):
    from orion.tokenizers.sentencepiece import SentencePieceTokenizer

    (tmp_path / "tokenizer.model").write_bytes(content)
    with pytest.raises(ModelLoadError, match="tokenizer.model"):
        SentencePieceTokenizer(tmp_path / "tokenizer.model")


@pytest.mark.parametrize("text", ["", "a", "hello world\n" * 3, "\n\n\n", "x" * 63])
def test_training_a_vocabulary_on_a_tiny_corpus(tmp_path, text):
    from orion.tokenizers.sentencepiece import train_sentencepiece

    (tmp_path / "c.txt").write_text(text)
    with pytest.raises(DataError, match="c.txt"):
        train_sentencepiece(tmp_path / "c.txt", 512, tmp_path / "t.model")


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"", b"   \n  \n"])
def test_bad_training_data(tmp_path, content):
    from hostile.helpers import tiny_train_config
    from orion.train.trainer import Trainer

    (tmp_path / "c.txt").write_bytes(content)
    with pytest.raises(DataError, match="c.txt"):
        Trainer(tiny_train_config(), tmp_path / "c.txt", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", [DEEP, "{", "[]", "null", '{"lr": }', '{"unknown": 1}'])
def test_a_broken_training_config_file(tmp_path, text):
    from orion.train.config import TrainConfig

    (tmp_path / "c.json").write_text(text)
    with pytest.raises(OrionError, match="c.json"):
        TrainConfig.from_file(tmp_path / "c.json")
