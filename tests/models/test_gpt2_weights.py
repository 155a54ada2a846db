"""A GPT-2 folder through orion.models.weights and the gpt2 architecture: names, shapes,
orientation, and errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from models.gpt2_reference import forward
from orion.errors import ModelLoadError
from orion.models.architectures import gpt2
from orion.models.registry import open_hf

torch = pytest.importorskip("torch", reason="the HF reference needs torch (test-only)")
transformers = pytest.importorskip("transformers", reason="the HF reference is test-only")


def hf_logits(folder, ids):
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_numpy_forward_matches_transformers(tiny_gpt2_dir):
    arch, weights = open_hf(tiny_gpt2_dir)
    a = arch.args
    assert a.n_layers == 2 and a.dim == 256 and not a.tie_embeddings
    ids = list(range(100, 140))
    ours, theirs = forward(a, weights, ids), hf_logits(tiny_gpt2_dir, ids)
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=0)


def test_conv1d_weights_are_transposed(tiny_gpt2_dir):
    from safetensors.numpy import load_file

    raw = load_file(tiny_gpt2_dir / "model.safetensors")
    _, weights = open_hf(tiny_gpt2_dir)
    c_fc = raw["transformer.h.1.mlp.c_fc.weight"]          # Conv1D: [in, out]
    assert c_fc.shape == (256, 1024)
    np.testing.assert_array_equal(weights.fp32("transformer.h.1.mlp.c_fc.weight"), c_fc.T)
    assert weights.shape("transformer.h.1.attn.c_attn.weight") == (768, 256)


def test_programs_read_fp16_and_the_host_keeps_no_weights(tiny_gpt2_dir):
    """A layer for the device is the file's values rounded to fp16 (what the program
    would bake from fp32 anyway); the loaded weights hold no array of their own, and
    the embedding lookup reads only its rows."""
    from safetensors.numpy import load_file

    raw = load_file(tiny_gpt2_dir / "model.safetensors")
    arch, weights = open_hf(tiny_gpt2_dir)
    w_out = weights.fp16("transformer.h.0.mlp.c_proj.weight")
    assert w_out.dtype == np.float16 and w_out.flags.c_contiguous
    np.testing.assert_array_equal(
        w_out, raw["transformer.h.0.mlp.c_proj.weight"].T.astype(np.float16))
    assert weights.fp32("transformer.h.0.mlp.c_proj.bias").dtype == np.float32
    assert not [k for k, v in vars(weights).items() if isinstance(v, np.ndarray)]
    ids = np.array([5, 50256, 5])
    want = raw["transformer.wte.weight"][ids] + raw["transformer.wpe.weight"][7:10]
    np.testing.assert_array_equal(arch.embed(weights, ids, 7), want)
    np.testing.assert_array_equal(weights.fp16(arch.classifier_name, slice(3, 9)),
                                  raw["lm_head.weight"][3:9].astype(np.float16))


@pytest.mark.slow
def test_a_bf16_folder_matches_transformers_on_the_same_weights(tmp_path, tiny_gpt2_dir):
    """GPT-2 saved in bf16 (as many Hub folders are): read exactly, so the fp32 forward
    equals transformers' fp32 forward of the same bf16-rounded weights."""
    model = transformers.GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir).eval()
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", safe_serialization=True)
    arch, weights = open_hf(tmp_path / "bf16")
    assert weights.st.tensors["lm_head.weight"].dtype == "BF16"
    ids = list(range(7, 47))
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "bf16",
                                                             dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = reference(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(forward(arch.args, weights, ids), theirs, atol=2e-4, rtol=0)


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_weights_file(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="no model.safetensors.*pickle files are never"):
        open_hf(folder)


def test_missing_config(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        open_hf(folder)


def test_wrong_architecture(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    raw["model_type"] = "bert"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="model_type 'bert' is not supported; known: "):
        open_hf(folder)


def test_config_that_does_not_match_the_weights(tmp_path, tiny_gpt2_dir):
    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    raw["n_layer"] = 1
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=r"unexpected \['transformer.h.1"):
        open_hf(folder)


def test_tensor_of_the_wrong_shape(tmp_path, tiny_gpt2_dir):
    from safetensors.numpy import load_file, save_file

    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.h.0.attn.c_proj.weight"] = np.zeros((256, 255), np.float32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"h.0.attn.c_proj.weight has shape \[255, 256\], "
                       r"config.json implies \[256, 256\]"):
        open_hf(folder)


@pytest.mark.parametrize(("value", "what"), [(np.float32(1e5), "outside fp16's range"),
                                             (np.float32(np.nan), "not finite"),
                                             (np.int32(1), "dtype 'I32'")])
def test_a_weight_the_device_cannot_hold_is_refused_by_name(tmp_path, tiny_gpt2_dir, value,
                                                            what):
    from safetensors.numpy import load_file, save_file

    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    name = "transformer.h.1.mlp.c_fc.bias"
    tensors[name] = np.full(tensors[name].shape, value)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=f"model.safetensors: tensor {name}.*{what}"):
        open_hf(folder)


def test_missing_tensor(tmp_path, tiny_gpt2_dir):
    from safetensors.numpy import load_file, save_file

    folder = copy_folder(tiny_gpt2_dir, tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    del tensors["transformer.ln_f.bias"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing \['transformer.ln_f.bias'\]"):
        open_hf(folder)


def test_unsupported_config_options():
    with pytest.raises(ModelLoadError, match="activation_function 'relu'"):
        gpt2.Model.from_config({"model_type": "gpt2", "activation_function": "relu"}, "c")
    with pytest.raises(ModelLoadError, match="scale_attn_by_inverse_layer_idx"):
        gpt2.Model.from_config({"scale_attn_by_inverse_layer_idx": True}, "c")
