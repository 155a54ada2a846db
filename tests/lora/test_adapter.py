"""Adapter files: PEFT's names and shapes, bf16 tensors, and broken files refused with
the file named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lora.conftest import peft_adapter
from orion.errors import LoraError
from orion.formats.peft import CONFIG_FILE, WEIGHTS_FILE, LoraConfig
from orion.models.adapters import init_adapter, load_adapter, save_adapter
from orion.models.registry import load_hf_arrays as load_hf


def test_reads_a_bf16_adapter_peft_saved(llama_dir, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    ad = peft_adapter(llama_dir, tmp_path / "ad", seed=7, targets=("q_proj", "up_proj"))
    f32 = load_file(ad / WEIGHTS_FILE)
    save_file({k: v.to(torch.bfloat16) for k, v in f32.items()}, ad / WEIGHTS_FILE)
    cfg, _ = load_hf(llama_dir)
    got = load_adapter(ad, cfg)
    for (layer, module), (a, b) in got.matrices.items():
        name_a, name_b = got.tensor(layer, module, "A"), got.tensor(layer, module, "B")
        np.testing.assert_array_equal(a, f32[name_a].to(torch.bfloat16).float().numpy())
        np.testing.assert_array_equal(b, f32[name_b].to(torch.bfloat16).float().numpy())


def test_save_then_load_round_trips(llama_dir, tmp_path):
    cfg, _ = load_hf(llama_dir)
    ad = init_adapter(LoraConfig(r=3, targets=("k_proj", "down_proj")), cfg, seed=1)
    save_adapter(tmp_path, ad)
    back = load_adapter(tmp_path, cfg)
    assert back.config == ad.config
    for k, (a, b) in ad.matrices.items():
        assert np.array_equal(back.matrices[k][0], a) and np.array_equal(back.matrices[k][1], b)
    assert json.loads((tmp_path / CONFIG_FILE).read_text())["peft_type"] == "LORA"


def test_broken_adapters_name_the_file(llama_dir, tmp_path):
    cfg, _ = load_hf(llama_dir)
    save_adapter(tmp_path, init_adapter(LoraConfig(r=2, targets=("q_proj",)), cfg))
    wrong = LoraConfig(r=4, targets=("q_proj",)).to_peft()
    (tmp_path / CONFIG_FILE).write_text(json.dumps(wrong))
    with pytest.raises(LoraError, match=r"lora_A.weight has shape \[2, 64\].*rank 4, so "
                       r"\[4, 64\] \(made for another base\?\)"):
        load_adapter(tmp_path, cfg)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(LoraConfig(r=2, targets=("v_proj",))
                                                   .to_peft()))
    with pytest.raises(LoraError, match="v_proj.lora_A.weight"):
        load_adapter(tmp_path, cfg)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"\xff" * 16)
    with pytest.raises(LoraError, match=f"{WEIGHTS_FILE}: not a safetensors file"):
        load_adapter(tmp_path, cfg)
    (tmp_path / WEIGHTS_FILE).unlink()
    with pytest.raises(LoraError, match="pickle"):
        load_adapter(tmp_path, cfg)


def test_targets_that_match_no_linear_layer_are_named(llama_dir):
    cfg, _ = load_hf(llama_dir)
    with pytest.raises(LoraError, match="match no linear layer .* self_attn.q_proj"):
        init_adapter(LoraConfig(r=2, targets=("lm_head",)), cfg)


def test_an_adapter_for_a_base_of_another_depth_says_so_in_the_bases_terms(llama_dir,
                                                                           tmp_path):
    from models.llama_args import llama

    cfg, _ = load_hf(llama_dir)
    deep = llama(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=2048,
                 hidden_dim=128, max_seq_len=128, tie_embeddings=False)
    shallow, deeper = tmp_path / "2", tmp_path / "4"
    save_adapter(shallow, init_adapter(LoraConfig(r=2, targets=("q_proj",),
                                                  base_model="org/two-layers"), cfg))
    with pytest.raises(LoraError, match=r"made for a 2-layer base \(org/two-layers\); "
                       r"this llama model has 4 layers"):
        load_adapter(shallow, deep)
    save_adapter(deeper, init_adapter(LoraConfig(r=2, targets=("q_proj",)), deep))
    with pytest.raises(LoraError, match="made for a base of at least 4 layers; this llama "
                       "model has 2"):
        load_adapter(deeper, cfg)


@pytest.mark.parametrize(("value", "what"), [
    (np.nan, "not finite"), (np.inf, "not finite"), (1e30, "range"), (300.0, "range")])
def test_values_the_device_cannot_hold_are_refused_by_module(llama_dir, tmp_path, value,
                                                              what):
    """One NaN, an infinity, or values whose change s B A leaves fp16 (A = B = 300 at
    rank 2: 180,000 per weight) are refused at load, naming the module; never served as
    non-finite logits."""
    from safetensors.numpy import save as safetensors_save

    from orion.formats.safetensors import read_file

    cfg, _ = load_hf(llama_dir)
    save_adapter(tmp_path, init_adapter(LoraConfig(r=2, alpha=2, targets=("q_proj",)), cfg))
    tensors, _ = read_file(tmp_path / WEIGHTS_FILE, fp16_range=False)
    name = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"
    if value == 300.0:
        for k in tensors:
            tensors[k][...] = 300.0
    else:
        tensors[name][0, 0] = value
    # the safetensors library's writer: Orion's refuses to write a non-finite value
    (tmp_path / WEIGHTS_FILE).write_bytes(safetensors_save(
        {k: np.asarray(v, np.float32) for k, v in tensors.items()}))
    with pytest.raises(LoraError, match=f"self_attn.q_proj.*{what}"):
        load_adapter(tmp_path, cfg)
