"""orion.models.gpt2_weights: names, shapes, orientation, and errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from models.gpt2_reference import forward
from orion.models.base import ModelLoadError
from orion.models.gpt2_weights import GPT2Config, load_gpt2_weights

torch = pytest.importorskip("torch", reason="the HF reference needs torch (test-only)")
transformers = pytest.importorskip("transformers", reason="the HF reference is test-only")


def hf_logits(folder, ids):
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_numpy_forward_matches_transformers(tiny_gpt2_dir):
    config, weights = load_gpt2_weights(tiny_gpt2_dir)
    assert config.n_layer == 2 and config.n_embd == 256 and not config.tie_word_embeddings
    ids = list(range(100, 140))
    ours, theirs = forward(config, weights, ids), hf_logits(tiny_gpt2_dir, ids)
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=0)


def test_conv1d_weights_are_transposed(tiny_gpt2_dir):
    from safetensors.numpy import load_file

    raw = load_file(tiny_gpt2_dir / "model.safetensors")
    _, weights = load_gpt2_weights(tiny_gpt2_dir)
    c_fc = raw["transformer.h.1.mlp.c_fc.weight"]          # Conv1D: [in, out]
    assert c_fc.shape == (256, 1024)
    np.testing.assert_array_equal(weights.layers[1].w_fc, c_fc.T)
    assert weights.layers[1].w_qkv.shape == (768, 256)


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_weights_file(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="no model.safetensors.*pickle files are never"):
        load_gpt2_weights(folder)


def test_missing_config(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_gpt2_weights(folder)


def test_wrong_architecture(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    raw["model_type"] = "bert"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="model_type 'bert' is not gpt2"):
        load_gpt2_weights(folder)


def test_config_that_does_not_match_the_weights(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    raw["n_layer"] = 1
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="does not have: h.1"):
        load_gpt2_weights(folder)


def test_tensor_of_the_wrong_shape(tmp_path, tiny_gpt2_dir):
    from safetensors.numpy import load_file, save_file

    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.h.0.attn.c_proj.weight"] = np.zeros((256, 255), np.float32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"h.0.attn.c_proj.weight has shape \[256, 255\], "
                       r"expected \[256, 256\]"):
        load_gpt2_weights(folder)


def test_missing_tensor(tmp_path, tiny_gpt2_dir):
    from safetensors.numpy import load_file, save_file

    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    del tensors["transformer.ln_f.bias"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="missing tensors ln_f.bias"):
        load_gpt2_weights(folder)


def test_unsupported_config_options():
    with pytest.raises(ModelLoadError, match="activation 'relu'"):
        GPT2Config.from_dict({"model_type": "gpt2", "activation_function": "relu"})
    with pytest.raises(ModelLoadError, match="scale_attn_by_inverse_layer_idx"):
        GPT2Config.from_dict({"scale_attn_by_inverse_layer_idx": True})
