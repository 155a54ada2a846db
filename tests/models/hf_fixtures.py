"""Model folders saved by transformers' own classes from the published configs of every
architecture Orion reads (test-only: torch and transformers).

Each entry of PUBLISHED is the model's config.json as published on the Hugging Face
hub (the fields that shape the math), and SHRINK says how the tests shrink it for CI
time: fewer layers and heads, but the real head_dim, GQA ratio, RoPE settings
(theta, llama3 scaling), biases, q/k norms, tied or untied classifier and vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

PUBLISHED: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "hidden_act": "silu", "hidden_size": 576,
        "intermediate_size": 1536, "max_position_embeddings": 8192,
        "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000,
        "tie_word_embeddings": True, "vocab_size": 49152, "mlp_bias": False,
        "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "bfloat16",
    },
    "SmolLM2-360M": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "hidden_act": "silu", "hidden_size": 960,
        "intermediate_size": 2560, "max_position_embeddings": 8192,
        "num_attention_heads": 15, "num_hidden_layers": 32, "num_key_value_heads": 5,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000,
        "tie_word_embeddings": True, "vocab_size": 49152, "mlp_bias": False,
        "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "bfloat16",
    },
    "Qwen2.5-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 24,
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936,
        "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "use_sliding_window": False, "vocab_size": 151936,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
    },
    "Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256,
        "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
    },
    "Mistral-7B-v0.1": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
        "vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    },
}

# Phi-3.5's LongRoPE factors (48 = head_dim / 2 of them): the published lists are not at
# hand offline, so these are made up in their shape and range (short ~1, long 1 -> ~50)
_SHORT = [round(1.0 + 0.2 * i / 47, 4) for i in range(48)]
_LONG = [round(1.0 + 49.0 * (i / 47) ** 2, 4) for i in range(48)]
PUBLISHED.update({
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "attention_bias": False, "attn_logit_softcapping": None, "bos_token_id": 2,
        "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
        "intermediate_size": 6912, "max_position_embeddings": 32768,
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
        "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144,
        "torch_dtype": "bfloat16",
    },
    "Phi-3-mini-4k": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "attention_bias": False, "bos_token_id": 1, "eos_token_id": 32000,
        "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
        "max_position_embeddings": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
        "sliding_window": 2047, "tie_word_embeddings": False, "vocab_size": 32064,
        "torch_dtype": "bfloat16",
    },
    "Phi-3.5-mini": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "attention_bias": False, "bos_token_id": 1, "eos_token_id": 32000,
        "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 262144,
        "rope_scaling": {"type": "longrope", "short_factor": _SHORT, "long_factor": _LONG},
        "tie_word_embeddings": False, "vocab_size": 32064, "torch_dtype": "bfloat16",
    },
})

# heads / kv heads divided by the same factor (the GQA ratio stays), head_dim kept,
# hidden_size scaled with the heads (Qwen3 keeps hidden < heads * head_dim).
SHRINK: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": {"num_attention_heads": 3, "num_key_value_heads": 1, "hidden_size": 192,
                     "intermediate_size": 512, "num_hidden_layers": 2},
    "Qwen2.5-0.5B": {"num_attention_heads": 7, "num_key_value_heads": 1, "hidden_size": 448,
                     "intermediate_size": 1216, "num_hidden_layers": 2},
    "Qwen3-0.6B": {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
                   "intermediate_size": 768, "num_hidden_layers": 2},
    "Llama-3.2-1B": {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512,
                     "intermediate_size": 1024, "num_hidden_layers": 2},
    "Mistral-7B-v0.1": {"num_attention_heads": 4, "num_key_value_heads": 1,
                        "hidden_size": 512, "intermediate_size": 1024,
                        "num_hidden_layers": 2, "sliding_window": 24},
    # the windows shrink too, so that 64 positions cross them; Gemma's vocabulary
    # shrinks (262,144 rows would be most of the test's time), and every second layer
    # of three is global
    "gemma-3-1b": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
                   "sliding_window": 16, "sliding_window_pattern": 2, "vocab_size": 16384},
    "Phi-3-mini-4k": {"num_attention_heads": 4, "num_key_value_heads": 4,
                      "hidden_size": 384, "intermediate_size": 512, "num_hidden_layers": 2,
                      "sliding_window": 24},
    "Phi-3.5-mini": {"num_attention_heads": 4, "num_key_value_heads": 4,
                     "hidden_size": 384, "intermediate_size": 512, "num_hidden_layers": 2},
}


def shrunk(name: str) -> dict[str, Any]:
    return {**PUBLISHED[name], **SHRINK.get(name, {})}


def save_hf_model(folder: Path, config: dict[str, Any], seed: int = 0,
                  embed_scale: float = 1.0) -> Path:
    """transformers' own random init (seeded) of `config`, saved in bf16 with
    save_pretrained (safetensors); config.json is then the published-format dict, so
    Orion reads the fields the hub's files have (transformers reads it back too).

    embed_scale multiplies the token embeddings: the residual stream then keeps the
    token's direction through the layers, and logits are spread far enough apart that
    a greedy argmax is not decided by rounding."""
    torch = pytest.importorskip("torch", reason="torch (test-only) builds the HF fixture")
    transformers = pytest.importorskip("transformers", reason="transformers is test-only")

    torch.manual_seed(seed)
    fields = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    hcfg = transformers.AutoConfig.for_model(**fields)
    model = transformers.AutoModelForCausalLM.from_config(hcfg, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(embed_scale)
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def hf_reference(folder: Path):
    """The saved folder read back by transformers in fp32 (the bf16-rounded weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def save_numpy_init(folder: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """A bf16 folder of `config` with N(0, 0.02) matrices and norms near 1, drawn with
    numpy: at a real size transformers' own init takes most of a minute on two cores.
    The tensor names come from Orion's list; `hf_reference` then proves transformers
    reads exactly those names (no missing or unexpected key)."""
    torch = pytest.importorskip("torch", reason="torch (test-only) writes the bf16 file")
    import numpy as np
    from safetensors.torch import save_file

    from orion.models.registry import architecture_from_config

    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in architecture_from_config(config, "test").parameters().items():
        if len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            a = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        tensors[name] = torch.from_numpy(a).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
