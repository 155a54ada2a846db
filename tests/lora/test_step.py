"""A and B gradients of one batch against PyTorch autograd through PEFT, for all
seven target modules, with the device running forward and activation gradients."""

from __future__ import annotations

import numpy as np
import pytest

from orion.lora.adapter import load_adapter
from orion.lora.config import MODULES
from orion.lora.step import LoraStep
from orion.models.llama_weights import load_hf
from tests.lora.conftest import peft_adapter

SEQ = 32
# Relative error bound ||g - g_ref|| / ||g_ref|| per tensor: the device computes in fp16
# (activations and activation gradients rounded after every op); measured ~3e-3 here.
REL = 2e-2


def peft_grads(base_dir, adapter_dir, tokens, targets, mask):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    base = transformers.LlamaForCausalLM.from_pretrained(
        base_dir, torch_dtype=torch.float64, attn_implementation="eager")
    model = peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True).double()
    logits = model(torch.tensor(tokens)).logits
    logp = torch.log_softmax(logits, -1)
    nll = -logp.gather(-1, torch.tensor(targets)[..., None])[..., 0]
    m = torch.tensor(mask, dtype=torch.float64)
    loss = (nll * m).sum() / m.sum()
    loss.backward()
    grads = {n.replace(".default", ""): p.grad.numpy() for n, p in model.named_parameters()
             if "lora_" in n}
    return float(loss.detach()), grads


def test_a_and_b_gradients_equal_peft_autograd_for_all_seven_modules(llama_dir, tmp_path,
                                                                    backend):
    ad_dir = peft_adapter(llama_dir, tmp_path / "ad", seed=3, targets=tuple(MODULES), r=4,
                          alpha=8.0, rank_pattern={"down_proj": 2})
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 2048, (2, SEQ))
    targets = rng.integers(0, 2048, (2, SEQ))
    mask = np.ones((2, SEQ), np.int64)
    mask[1, :10] = 0            # a prompt: no loss on its targets
    ref_loss, ref = peft_grads(llama_dir, ad_dir, tokens, targets, mask)
    cfg, weights = load_hf(llama_dir)
    adapter = load_adapter(ad_dir, cfg)
    step = LoraStep(cfg, weights, adapter, SEQ, backend)
    try:
        out = step(adapter, tokens, targets, mask)
    finally:
        step.release()
    assert out.finite and out.tokens == int(mask.sum())
    assert out.loss == pytest.approx(ref_loss, abs=1e-2)
    assert set(out.grads) == set(ref)
    assert {n.split(".")[-3] for n in ref} == set(MODULES)
    for name, g in ref.items():
        err = np.linalg.norm(out.grads[name] - g) / np.linalg.norm(g)
        assert err < REL, (name, err)
