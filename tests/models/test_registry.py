"""orion.models.registry: an architecture by model_type (a file per architecture, no list
to edit), llama2.c checkpoints, and the thin repo-id path; orion.models.base's shared
pieces."""

from __future__ import annotations

import json
import sys
import types

import pytest

from orion.errors import ModelLoadError
from orion.models import base, registry
from orion.models.registry import architecture_class, load_model, resolve_path


def write_config(folder, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def test_every_architecture_file_is_found_by_its_model_type():
    known = registry.known_model_types()
    assert known == sorted(["gemma3_text", "gpt2", "llama", "mistral", "phi3", "qwen2",
                            "qwen3"])
    for name in known:
        cls = architecture_class(name, "c")
        assert cls.__module__ == f"orion.models.architectures.{name}"


@pytest.mark.parametrize("bad", ["bert", ["gpt2"], None, "../etc/passwd", "Llama", 7])
def test_unknown_model_types_are_refused_by_name(bad):
    with pytest.raises(ModelLoadError, match="model_type .* is not supported; known: "):
        architecture_class(bad, "x/config.json")


def test_llama2c_file_and_folder(tmp_path):
    ckpt = tmp_path / "stories.bin"
    ckpt.write_bytes(b"\0" * 28)
    assert registry._llama2c_file(ckpt) == ckpt
    only = tmp_path / "c2"
    only.mkdir()
    (only / "model.bin").write_bytes(b"\0" * 28)
    assert registry._llama2c_file(only) == only / "model.bin"


def test_unknown_or_missing(tmp_path):
    with pytest.raises(ModelLoadError, match="model_type 'bert' is not supported"):
        load_model(write_config(tmp_path / "b", model_type="bert"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "w.pt").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="llama2.c .bin"):
        load_model(tmp_path / "w.pt")
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_model(tmp_path / "bad")


def test_repo_id_is_fetched_with_huggingface_hub(tmp_path, monkeypatch):
    """Offline: the hub client is replaced; what is checked is what Orion asks of it."""
    calls = []

    def snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(write_config(tmp_path / "snap", model_type="gpt2"))

    monkeypatch.setitem(sys.modules, "huggingface_hub",
                        types.SimpleNamespace(snapshot_download=snapshot_download))
    monkeypatch.chdir(tmp_path)
    assert resolve_path("openai-community/gpt2") == tmp_path / "snap"
    repo, patterns = calls[0]
    assert repo == "openai-community/gpt2"
    assert "*.safetensors" in patterns and not any(p.endswith((".bin", ".pt")) for p in patterns)


def test_repo_id_without_huggingface_hub(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError, match="huggingface_hub .* is not installed"):
        resolve_path("openai-community/gpt2")


def test_paths_that_are_not_repo_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for text in ("./a/b", "a/b/c", "C:\\x", "~/x/y"):
        assert not registry._looks_like_repo_id(text)
        with pytest.raises(ModelLoadError, match="no such file or folder"):
            resolve_path(text)


def test_stats_since():
    s = base.ModelStats(programs_compiled=3, cache_hits=10)
    before = s.snapshot()
    s.programs_compiled += 1
    s.cache_hits += 5
    delta = s.since(before)
    assert (delta.programs_compiled, delta.cache_hits) == (1, 5)


# ---- what a model and a tokenizer say they are ---------------------------------------


def test_human_count():
    assert [base.human_count(n) for n in (999, 1234, 2_200_000, 124_439_808, 7e9)] == [
        "999", "1.2K", "2.2M", "124.4M", "7.0B"]


@pytest.mark.native
def test_gpt2_repr_counts_what_transformers_counts(tiny_gpt2, tiny_gpt2_dir):
    transformers = pytest.importorskip("transformers", reason="the HF count is the reference")
    pytest.importorskip("torch", reason="transformers needs torch")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir)
    assert tiny_gpt2.weights.parameter_count() == hf.num_parameters()
    text = repr(tiny_gpt2)
    assert text.startswith("<TransformerLM GPT-2, ")
    assert base.human_count(hf.num_parameters()) in text
    assert "2 layers, dim 256, 4 heads, vocab 50257" in text
    assert f"context {tiny_gpt2.max_length} tokens, backend {tiny_gpt2.backend}" in text


@pytest.mark.native
def test_llama_and_tokenizer_reprs():
    import orion

    model, tokenizer = orion.load()
    try:
        text = repr(model)
        assert text.startswith("<TransformerLM Llama, 2.2M parameters (4 layers, dim 192")
        assert text.endswith(f"context 256 tokens, backend {model.backend}>")
    finally:
        model.close()
    assert repr(model).endswith(", closed>")
    assert repr(tokenizer).startswith("<SentencePieceTokenizer tokenizer.model (sp-")
    assert "2048 pieces, bos 1, eos 2" in repr(tokenizer)
    from orion.tokenizers.gpt2 import GPT2Tokenizer

    assert repr(GPT2Tokenizer.default()) == (
        "<GPT2Tokenizer 'gpt2': byte-level BPE, 50257 tokens, 1 special, eos 50256>")


@pytest.mark.parametrize("tied", [True, False])
def test_llama_parameter_count_is_transformers_count(tied):
    from models.llama_args import llama
    from models.llama_torch import hf_model
    from orion.models.weights import ArrayWeights, init_weights

    arch = llama(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300, hidden_dim=96,
                 max_seq_len=32, tie_embeddings=tied)
    w = init_weights(arch, 0)
    assert ArrayWeights(w).parameter_count() == \
        hf_model(arch.args, w, "float32").num_parameters()
