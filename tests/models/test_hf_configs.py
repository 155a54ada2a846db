"""config.json of every architecture: every published config parses to the right
options, and every field that is out of range, of the wrong type, or changes the math
in a way Orion does not implement is a ModelLoadError naming the field, before anything
is allocated."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import ModelLoadError
from orion.models.registry import architecture_from_config
from orion.models.rope import RopeScaling

from .hf_fixtures import PUBLISHED


def config_from_hf(d, where="config.json"):
    return architecture_from_config(d, where).args


def test_published_configs_parse_to_their_options():
    qwen3 = architecture_from_config(PUBLISHED["Qwen3-0.6B"], "c")
    a = qwen3.args
    assert (qwen3.model_type, a.head_dim, a.q_dim, a.dim, a.qkv_bias) == \
        ("qwen3", 128, 2048, 1024, False)
    assert "self_attn.q_norm.weight" in qwen3.layer_parameters(0)
    qwen2 = config_from_hf(PUBLISHED["Qwen2.5-0.5B"])
    assert qwen2.qkv_bias and not qwen2.o_bias and set(qwen2.windows) == {0}
    llama = config_from_hf(PUBLISHED["Llama-3.2-1B"])
    assert llama.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert llama.tie_embeddings and llama.rope_theta == 500000.0
    mistral = config_from_hf(PUBLISHED["Mistral-7B-v0.1"])
    assert set(mistral.windows) == {4096} and not mistral.tie_embeddings
    smol = config_from_hf(PUBLISHED["SmolLM2-135M"])
    assert (smol.n_heads, smol.n_kv_heads, smol.qkv_bias) == (9, 3, False)
    gemma = architecture_from_config(PUBLISHED["gemma-3-1b"], "c")
    g = gemma.args
    assert g.windows == tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(26))
    assert (g.local_theta, g.global_theta, g.query_scale) == (10000.0, 1_000_000.0, 1 / 16)
    assert gemma.attention(5).rope.theta == 1_000_000.0 and gemma.attention(5).window == 0
    assert gemma.attention(0).rope.theta == 10000.0 and gemma.attention(0).window == 512
    phi = config_from_hf(PUBLISHED["Phi-3.5-mini"])
    assert phi.rope_scaling.kind == "longrope" and phi.max_positions == 4096
    assert phi.rope_scaling.factor == 32.0 and set(phi.windows) == {262144}


def test_transformers_5_rope_parameters_are_read():
    d = {**PUBLISHED["Llama-3.2-1B"]}
    scaling = d.pop("rope_scaling")
    d["rope_parameters"] = {**scaling, "rope_theta": d.pop("rope_theta")}
    assert config_from_hf(d) == config_from_hf(PUBLISHED["Llama-3.2-1B"])


@pytest.mark.parametrize("kind", ["llama3", "linear", "longrope"])
def test_rope_frequencies_equal_transformers(kind):
    torch = pytest.importorskip("torch", reason="transformers' RoPE is the reference")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = dict(PUBLISHED["Phi-3.5-mini" if kind == "longrope" else "Llama-3.2-1B"])
    if kind == "linear":
        d["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    fields = {k: v for k, v in d.items() if k not in ("architectures", "torch_dtype")}
    expected, factor = ROPE_INIT_FUNCTIONS[kind](
        transformers.AutoConfig.for_model(**fields), "cpu")
    rope = architecture_from_config(d, "c").attention(0).rope
    np.testing.assert_allclose(rope.inv_freq(), expected.to(torch.float64), rtol=1e-6)
    assert rope.attention_factor() == pytest.approx(factor, rel=1e-6)


BAD = [
    ({"model_type": "gemma"}, "model_type"),
    ({"model_type": ["gpt2"]}, "model_type"),
    ({"num_hidden_layers": 1_000_000_000}, "num_hidden_layers"),
    ({"max_position_embeddings": 1_000_000_000}, "max_position_embeddings"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"hidden_size": "576"}, "hidden_size"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),      # 9 heads
    ({"vocab_size": 1.5}, "vocab_size"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ({"rope_theta": -1}, "rope_theta"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"rope_scaling": "llama3"}, "rope_scaling"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"head_dim": 63}, "head_dim"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
]


@pytest.mark.parametrize(("change", "field"), BAD, ids=[f for _, f in BAD])
def test_bad_fields_are_refused_by_name(change, field):
    with pytest.raises(ModelLoadError, match=field.replace(".", r"\.")):
        config_from_hf({**PUBLISHED["SmolLM2-135M"], **change}, "x/config.json")


GEMMA_BAD = [
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "relu"}, "hidden_activation"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
]


@pytest.mark.parametrize(("change", "field"), GEMMA_BAD, ids=[f for _, f in GEMMA_BAD])
def test_gemma_fields_it_does_not_implement_are_refused(change, field):
    with pytest.raises(ModelLoadError, match=field):
        config_from_hf({**PUBLISHED["gemma-3-1b"], **change}, "x/config.json")


def test_phi3_fields_it_does_not_implement_are_refused():
    with pytest.raises(ModelLoadError, match="partial_rotary_factor"):
        config_from_hf({**PUBLISHED["Phi-3.5-mini"], "partial_rotary_factor": 0.75})
    bad = {**PUBLISHED["Phi-3.5-mini"]["rope_scaling"], "short_factor": [1.0] * 47}
    with pytest.raises(ModelLoadError, match="short_factor"):
        config_from_hf({**PUBLISHED["Phi-3.5-mini"], "rope_scaling": bad})
