"""Adapter files: PEFT's names and shapes, bf16 tensors, and broken files refused with
the file named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lora.conftest import peft_adapter
from orion.lora.adapter import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    init_adapter,
    load_adapter,
    save_adapter,
    tensor_name,
)
from orion.lora.config import LoraConfig, LoraError
from orion.models.llama_weights import load_hf


def test_reads_a_bf16_adapter_peft_saved(llama_dir, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    ad = peft_adapter(llama_dir, tmp_path / "ad", seed=7, targets=("q_proj", "up_proj"))
    f32 = load_file(ad / WEIGHTS_FILE)
    save_file({k: v.to(torch.bfloat16) for k, v in f32.items()}, ad / WEIGHTS_FILE)
    cfg, _ = load_hf(llama_dir)
    got = load_adapter(ad, cfg)
    for (layer, module), (a, b) in got.matrices.items():
        name_a, name_b = tensor_name(layer, module, "A"), tensor_name(layer, module, "B")
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
    with pytest.raises(LoraError, match=r"lora_A.weight has shape \(2, 64\).*\(4, 64\)"):
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
