"""PEFT LoRA adapters made by peft itself (the reference), with nonzero A and B so that
they change the model, for tests of what takes --adapter-path. Independent of
orion.lora's own test helpers, so these tests check Orion against PEFT only."""

from __future__ import annotations

from pathlib import Path

import pytest


def peft_adapter(base_dir: Path, out: Path, seed: int,
                 targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj"), r: int = 4,
                 alpha: float = 8.0) -> Path:
    """An adapter for the model folder `base_dir`, saved by peft in `out`."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft", reason="peft (test extra) is the reference")
    transformers = pytest.importorskip("transformers")
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=alpha,
                                                      target_modules=list(targets)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(out)
    return out
