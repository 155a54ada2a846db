"""PEFT's adapter_config.json: scales as PEFT computes them, patterns, and options
Orion does not implement refused by name."""

from __future__ import annotations

import math

import pytest

from orion.lora.config import LoraConfig, LoraError


def peft(**over):
    return {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"],
            **over}


def test_scale_rank_and_alpha_patterns_and_rslora():
    c = LoraConfig.from_peft(peft(target_modules=["q_proj", "down_proj"],
                                  rank_pattern={"down_proj": 2},
                                  alpha_pattern={"model.layers.1.self_attn.q_proj": 4}))
    assert c.scale(0, "q_proj") == 2.0 and c.rank(0, "down_proj") == 2
    assert c.scale(0, "down_proj") == 8.0 and c.scale(1, "q_proj") == 0.5
    rs = LoraConfig.from_peft(peft(use_rslora=True))
    assert rs.scale(0, "q_proj") == pytest.approx(16 / math.sqrt(8))


def test_round_trip_through_peft_json():
    c = LoraConfig(r=4, alpha=8, targets=("v_proj", "q_proj"), use_rslora=True,
                   rank_pattern={"v_proj": 2}, base_model="m")
    assert LoraConfig.from_peft(c.to_peft()) == c


@pytest.mark.parametrize("option, value", [
    ("use_dora", True), ("bias", "all"), ("lora_bias", True), ("modules_to_save", ["lm_head"]),
    ("layers_to_transform", [0]), ("fan_in_fan_out", True), ("some_future_option", 1)])
def test_unimplemented_options_are_named(option, value):
    with pytest.raises(LoraError, match=option):
        LoraConfig.from_peft(peft(**{option: value}), "x/adapter_config.json")


def test_bad_configs():
    with pytest.raises(LoraError, match="peft_type"):
        LoraConfig.from_peft(peft(peft_type="IA3"))
    with pytest.raises(LoraError, match="not Llama linear layers"):
        LoraConfig.from_peft(peft(target_modules=["lm_head"]))
    with pytest.raises(LoraError, match="regex"):
        LoraConfig.from_peft(peft(target_modules=".*proj"))
    with pytest.raises(LoraError, match="positive"):
        LoraConfig.from_peft(peft(r=0))
