"""Llama-family folders as `open_hf` checks them: names, shapes and dtypes against
config.json before anything is allocated, and the loaded model's limits (Mistral's
window, a folder without a tokenizer, the backend choice)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.llama_args import llama
from orion.errors import ModelLoadError
from orion.models import load_model
from orion.models.registry import load_hf_arrays, open_hf
from orion.models.runtime import RuntimeOptions, TransformerLM
from orion.models.weights import ArrayWeights, init_weights, save_folder

ARCH = llama(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, hidden_dim=96,
             max_seq_len=256)
CFG = ARCH.args


@pytest.fixture
def folder(tmp_path):
    save_folder(tmp_path, ARCH, init_weights(ARCH, 0), dtype="float16")
    return tmp_path


def _edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _rewrite(folder, change):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_round_trip_in_fp16(folder):
    arch, w = load_hf_arrays(folder)
    assert arch == ARCH
    ref = init_weights(ARCH, 0)
    for name, arr in w.items():
        np.testing.assert_array_equal(arr, ref[name].astype(np.float16).astype(np.float32))


def test_more_layers_in_config_than_in_weights_is_refused(folder):
    _edit_config(folder, num_hidden_layers=3)
    with pytest.raises(ModelLoadError, match=r"missing \['model.layers.2"):
        open_hf(folder)


def test_wrong_shape_names_the_tensor(folder):
    def change(t):
        t["model.layers.1.mlp.up_proj.weight"] = np.zeros((95, 64), np.float16)
    _rewrite(folder, change)
    with pytest.raises(ModelLoadError, match=r"model.layers.1.mlp.up_proj.weight has shape "
                                             r"\[95, 64\]"):
        open_hf(folder)


def test_wrong_dtype_names_the_tensor(folder):
    def change(t):
        t["model.norm.weight"] = t["model.norm.weight"].astype(np.int32)
    _rewrite(folder, change)
    with pytest.raises(ModelLoadError, match=r"tensor model.norm.weight: dtype 'I32'"):
        open_hf(folder)


def test_qwen2_without_its_biases_is_refused(folder):
    _edit_config(folder, model_type="qwen2")
    with pytest.raises(ModelLoadError, match=r"missing \['model.layers.0.self_attn.k_proj.bias"):
        open_hf(folder)


@pytest.mark.slow
def test_mistral_attends_within_its_window_past_it(folder, gpt2_compile_budget):
    """The sliding window is implemented, not a cap on the context: a prompt past the
    window prefills, decoding goes on to the largest bucket, and a token at p attends to
    p - 63 .. p (the windowed mask; logits against transformers in test_architectures_hf)."""
    _edit_config(folder, model_type="mistral", sliding_window=64)
    with load_model(folder, decode_buckets=(64, 128), prefill_buckets=(32, 64)) as m:
        assert m.max_length == 128
        m.prefill(list(range(70)))
        m.decode(1)
        mask = m._cache._masks[64]
        # the next step (p = 71) sees 8 .. 70 from the cache, and itself
        assert (mask[:8] != 0).all() and (mask[8:71] == 0).all() and (mask[71:] != 0).all()


@pytest.mark.slow
def test_weights_only_folder_loads_and_its_tokenizer_says_why_not(folder,
                                                                 gpt2_compile_budget):
    with load_model(folder) as m:
        assert m.prefill([1, 2, 3]).shape == (CFG.vocab_size,)
        with pytest.raises(ModelLoadError, match="no tokenizer"):
            m.tokenizer.encode("hi")


@pytest.mark.slow
def test_orion_backend_is_honoured(folder, monkeypatch, gpt2_compile_budget):
    monkeypatch.setenv("ORION_BACKEND", "nonexistent")
    with load_model(folder) as m:
        with pytest.raises(Exception, match="nonexistent"):
            m.prefill([1, 2, 3])
    monkeypatch.setenv("ORION_BACKEND", "vane")
    with load_model(folder, backend="auto") as m:
        m.prefill([1, 2, 3])
        assert m.backend == "vane"


@pytest.mark.slow
def test_a_model_with_more_programs_than_the_device_holds_evicts_and_reloads(
        gpt2_compile_budget):
    """64 layers, one a program: prefill + decode + head is 129 programs, over the 127
    a process may hold loaded (ANE-C34); the least recently used are unloaded and
    reloaded, and the logits still match the numpy reference."""
    from models.llama_reference import forward
    from orion.runtime import loaded_programs

    arch = llama(dim=32, n_layers=64, n_heads=2, n_kv_heads=1, vocab_size=64,
                 hidden_dim=32, max_seq_len=64)
    cfg = arch.args
    w = init_weights(arch, 3)
    ids = [5, 9, 2, 7, 1, 3, 8]
    ref, _ = forward(cfg, w, np.array([ids]))
    with TransformerLM(arch, ArrayWeights(w), None,
                       options=RuntimeOptions(program_weight_bytes=0)) as m:
        outs = [m.prefill(ids[:4])] + [m.decode(t) for t in ids[4:]]
        assert m.stats.programs_compiled == 2 * cfg.n_layers + 1
        assert loaded_programs() <= 127
    np.testing.assert_allclose(np.stack(outs), ref[0, 3:], atol=2e-2 * np.abs(ref).max())
