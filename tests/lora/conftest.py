"""Fixtures: a random-init transformers Llama saved as a HF folder (with the shipped
Shakespeare tokenizer, vocabulary 2048), and PEFT adapters on it with nonzero B."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from models.conftest import tiny_gpt2_dir  # noqa: F401 - the GPT-2 fixture, for lora tests

from orion.models import default_model_path

# the seven linear layers of a Llama-family layer, as PEFT's target_modules name them
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

VOCAB = 2048
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
             max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False, initializer_range=0.08)


def hf_llama(seed: int = 0):
    torch = pytest.importorskip("torch", reason="torch (test extra) builds the reference")
    transformers = pytest.importorskip("transformers", reason="transformers is the reference")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**SMALL)
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg).float().eval()


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    hf_llama().save_pretrained(folder, safe_serialization=True)
    shutil.copy(default_model_path() / "tokenizer.model", folder / "tokenizer.model")
    return folder


def peft_adapter(base_dir: Path, out: Path, seed: int, targets=tuple(MODULES), r: int = 4,
                 alpha: float = 8.0, **extra) -> Path:
    """A PEFT adapter saved by peft itself, with lora_B filled with nonzero values."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft", reason="peft (test extra) is the reference")
    transformers = pytest.importorskip("transformers")
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                          init_lora_weights=True, **extra)
    model = peft.get_peft_model(base, cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(out)
    return out


def peft_logits(base_dir: Path, adapter_dir: Path | None, ids):
    """PEFT's (or the base model's) fp32 logits [S, V] for token ids."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    base = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model = base if adapter_dir is None else peft.PeftModel.from_pretrained(base, adapter_dir)
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].numpy()


def shipped_adapter(out: Path, seed: int, targets=("q_proj", "v_proj", "down_proj")) -> Path:
    """An adapter for the shipped model written by Orion, with nonzero B so it changes
    the model's text (for tests of the commands that take --adapter-path)."""
    import numpy as np

    from orion.formats.peft import LoraConfig
    from orion.models.adapters import init_adapter, save_adapter
    from orion.models.registry import open_hf

    arch, _ = open_hf(default_model_path())
    ad = init_adapter(LoraConfig(r=4, alpha=8, targets=tuple(targets)), arch, seed=seed)
    rng = np.random.default_rng(seed)
    for _a, b in ad.matrices.values():
        b[...] = rng.standard_normal(b.shape) * 0.5
    save_adapter(out, ad)
    return out
