"""PEFT's adapter_config.json: scales as PEFT computes them, patterns, and options
Orion does not implement refused by name, and values from a file checked before use."""

from __future__ import annotations

import math

import pytest

from orion.errors import LoraError
from orion.formats.peft import LoraConfig

Q0, Q1 = "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"
DOWN0 = "model.layers.0.mlp.down_proj"


def peft(**over):
    return {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"],
            **over}


def test_scale_rank_and_alpha_patterns_and_rslora():
    c = LoraConfig.from_peft(peft(target_modules=["q_proj", "down_proj"],
                                  rank_pattern={"down_proj": 2},
                                  alpha_pattern={"model.layers.1.self_attn.q_proj": 4}))
    assert c.scale(Q0) == 2.0 and c.rank(DOWN0) == 2
    assert c.scale(DOWN0) == 8.0 and c.scale(Q1) == 0.5
    assert c.adapts(Q0) and c.adapts(DOWN0) and not c.adapts("model.layers.0.mlp.up_proj")
    rs = LoraConfig.from_peft(peft(use_rslora=True))
    assert rs.scale(Q0) == pytest.approx(16 / math.sqrt(8))


def test_round_trip_through_peft_json():
    c = LoraConfig(r=4, alpha=8, targets=("v_proj", "q_proj"), use_rslora=True,
                   rank_pattern={"v_proj": 2}, base_model="m")
    assert LoraConfig.from_peft(c.to_peft()) == c


@pytest.mark.parametrize("option, value", [
    ("use_dora", True), ("bias", "all"), ("lora_bias", True), ("modules_to_save", ["lm_head"]),
    ("layers_to_transform", [0]), ("some_future_option", 1)])
def test_unimplemented_options_are_named(option, value):
    with pytest.raises(LoraError, match=option):
        LoraConfig.from_peft(peft(**{option: value}), "x/adapter_config.json")


def test_bad_configs():
    with pytest.raises(LoraError, match="peft_type"):
        LoraConfig.from_peft(peft(peft_type="IA3"))
    with pytest.raises(LoraError, match="regex"):
        LoraConfig.from_peft(peft(target_modules=".*proj"))
    with pytest.raises(LoraError, match="positive"):
        LoraConfig.from_peft(peft(r=0))


@pytest.mark.parametrize(("change", "what"), [
    ({"r": "4"}, "r must be an integer"),
    ({"r": 8.5}, "r must be an integer"),
    ({"lora_alpha": float("nan")}, "lora_alpha"),
    ({"lora_alpha": float("inf")}, "lora_alpha"),
    ({"lora_alpha": 1e30}, "lora_alpha"),
    ({"lora_alpha": -1e6}, "lora_alpha"),
    ({"rank_pattern": {"q_proj": "2"}}, "rank_pattern"),
    ({"alpha_pattern": {"q_proj": float("nan")}}, "alpha_pattern"),
    ({"use_rslora": "yes"}, "use_rslora"),
])
def test_values_from_the_file_are_checked_not_cast(change, what):
    with pytest.raises(LoraError, match=what):
        LoraConfig.from_peft(peft(**change), "x/adapter_config.json")


@pytest.mark.parametrize("key", ["(.*)*x", "(a|aa)+b", "(x+)+", "(?(1)a|b)"])
def test_patterns_that_could_take_exponential_time_are_refused(key):
    """A pattern key comes from a file: one that nests repetition is refused by name
    at once rather than matched (Python's re would backtrack for minutes)."""
    with pytest.raises(LoraError, match="pattern"):
        LoraConfig.from_peft(peft(rank_pattern={key: 2}))


def test_plain_and_simple_regex_patterns_still_match():
    c = LoraConfig.from_peft(peft(rank_pattern={r"layers\.1\..*q_proj": 2, "q_proj": 4}))
    assert c.rank(Q1) == 2 and c.rank(Q0) == 4


def test_fan_in_fan_out_is_accepted():
    """GPT-2's Conv1D stores W as [in, out]: PEFT sets fan_in_fan_out, which changes only
    how it merges; A and B are the usual matrices."""
    c = LoraConfig.from_peft(peft(target_modules=["c_attn"], fan_in_fan_out=True))
    assert c.adapts("transformer.h.0.attn.c_attn")
