"""config.json of the Llama family: every published config parses to the right
options, and every field that is out of range, of the wrong type, or changes the math
in a way Orion does not implement is a ModelLoadError naming the field, before
anything is allocated."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import ModelLoadError
from orion.models.llama_config import LlamaConfig, RopeScaling
from orion.models.llama_hf_config import config_from_hf
from orion.models.llama_rope import inv_freq

from .llama_hf_fixtures import PUBLISHED


def test_published_configs_parse_to_their_options():
    qwen3 = config_from_hf(PUBLISHED["Qwen3-0.6B"])
    assert (qwen3.head_dim, qwen3.q_dim, qwen3.dim, qwen3.qk_norm, qwen3.qkv_bias) == \
        (128, 2048, 1024, True, False)
    qwen2 = config_from_hf(PUBLISHED["Qwen2.5-0.5B"])
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.sliding_window == 0
    llama = config_from_hf(PUBLISHED["Llama-3.2-1B"])
    assert llama.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert llama.tie_embeddings and llama.rope_theta == 500000.0
    mistral = config_from_hf(PUBLISHED["Mistral-7B-v0.1"])
    assert mistral.sliding_window == 4096 and not mistral.tie_embeddings
    smol = config_from_hf(PUBLISHED["SmolLM2-135M"])
    assert smol.plain and (smol.n_heads, smol.n_kv_heads) == (9, 3)


def test_transformers_5_rope_parameters_are_read():
    d = {**PUBLISHED["Llama-3.2-1B"]}
    scaling = d.pop("rope_scaling")
    d["rope_parameters"] = {**scaling, "rope_theta": d.pop("rope_theta")}
    assert config_from_hf(d) == config_from_hf(PUBLISHED["Llama-3.2-1B"])


@pytest.mark.parametrize("kind", ["llama3", "linear"])
def test_rope_frequencies_equal_transformers(kind):
    torch = pytest.importorskip("torch", reason="transformers' RoPE is the reference")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = dict(PUBLISHED["Llama-3.2-1B"])
    if kind == "linear":
        d["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    fields = {k: v for k, v in d.items() if k not in ("architectures", "torch_dtype")}
    expected, _ = ROPE_INIT_FUNCTIONS[kind](transformers.AutoConfig.for_model(**fields), "cpu")
    np.testing.assert_allclose(inv_freq(config_from_hf(d)), expected.to(torch.float64),
                               rtol=1e-6)


BAD = [
    ({"model_type": "gemma"}, "model_type"),
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


def test_training_programs_refuse_family_options():
    from orion.models.llama_programs import build_layer_graph

    cfg = LlamaConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=50,
                      hidden_dim=64, head_size=64, qk_norm=True)
    with pytest.raises(ValueError, match="plain Llama"):
        build_layer_graph("attn_fwd", cfg, {}, 0, 32, "inputs")
