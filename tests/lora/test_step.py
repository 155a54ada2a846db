"""A and B gradients of one batch against PyTorch autograd through PEFT, for all
seven target modules, with the device running forward and activation gradients; for a
Llama, and for Qwen2- and Qwen3-shaped models (biases, q/k norms, GQA)."""

from __future__ import annotations

import numpy as np
import pytest

import orion.runtime
from lora.conftest import MODULES, peft_adapter
from orion.formats.peft import LoraConfig
from orion.lora.step import LoraStep
from orion.models.adapters import init_adapter, load_adapter
from orion.models.registry import load_hf_arrays


def load_hf(folder):
    return load_hf_arrays(folder)

SEQ = 32
# Relative error bound ||g - g_ref|| / ||g_ref|| per tensor: the device computes in fp16
# (activations and activation gradients rounded after every op); measured ~3e-3 here.
REL = 2e-2


def peft_grads(base_dir, adapter_dir, tokens, targets, mask, dropout_masks=None):
    """PEFT's loss and LoRA gradients in fp64; `dropout_masks` (one dict (layer, module)
    -> [in, S] per sequence) replace PEFT's dropout modules with those fixed masks."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    base = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float64, attn_implementation="eager")
    model = peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True).double()
    if dropout_masks is not None:
        class FixedMask(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return x * self.m

        layers = model.base_model.model.model.layers
        for (layer, module) in dropout_masks[0]:
            m = torch.tensor(np.stack([d[layer, module].T for d in dropout_masks]),
                             dtype=torch.float64)
            part, name = module.split(".")     # "self_attn.q_proj"
            getattr(getattr(layers[layer], part), name).lora_dropout["default"] = FixedMask(m)
    logits = model(torch.tensor(tokens)).logits
    logp = torch.log_softmax(logits, -1)
    nll = -logp.gather(-1, torch.tensor(targets)[..., None])[..., 0]
    m = torch.tensor(mask, dtype=torch.float64)
    loss = (nll * m).sum() / m.sum()
    loss.backward()
    grads = {n.replace(".default", ""): p.grad.numpy() for n, p in model.named_parameters()
             if "lora_" in n}
    return float(loss.detach()), grads


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["delta", "inputs"])
def test_a_and_b_gradients_equal_peft_autograd_for_all_seven_modules(llama_dir, tmp_path,
                                                                    backend, strategy):
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
    step = LoraStep(cfg, weights, adapter, SEQ, backend, strategy=strategy)
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


@pytest.mark.slow
def test_gradients_with_dropout_equal_peft_with_the_same_masks(llama_dir, tmp_path, backend):
    ad_dir = peft_adapter(llama_dir, tmp_path / "ad", seed=4, targets=tuple(MODULES), r=4,
                          alpha=8.0)
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, 2048, (2, SEQ)), rng.integers(0, 2048, (2, SEQ))
    mask = np.ones((2, SEQ), np.int64)
    cfg, weights = load_hf(llama_dir)
    adapter = load_adapter(ad_dir, cfg)
    step = LoraStep(cfg, weights, adapter, SEQ, backend, dropout=0.3)
    try:
        masks = [step.make_masks(np.random.default_rng(i)) for i in range(2)]
        out = step(adapter, tokens, targets, mask, dropout=masks)
        plain = step(adapter, tokens, targets, mask, loss_only=True)   # keep-all masks
    finally:
        step.release()
    ref_loss, ref = peft_grads(llama_dir, ad_dir, tokens, targets, mask, masks)
    no_drop_loss, _ = peft_grads(llama_dir, ad_dir, tokens, targets, mask)
    assert 0.6 < np.mean([m.mean() for m in masks[0].values()]) / (1 / 0.7) < 0.8
    assert out.loss == pytest.approx(ref_loss, abs=1e-2)
    assert plain.loss == pytest.approx(no_drop_loss, abs=1e-2)
    assert abs(ref_loss - no_drop_loss) > 1e-3        # the masks matter
    for name, g in ref.items():
        err = np.linalg.norm(out.grads[name] - g) / np.linalg.norm(g)
        assert err < REL, (name, err)


def test_base_is_an_input_staged_once_when_baking_would_exceed_the_budget(
        llama_dir, backend, monkeypatch):
    cfg, weights = load_hf(llama_dir)
    adapter = init_adapter(LoraConfig(r=2), cfg)
    left = 2 * (cfg.args.n_layers + 1) - 1     # one short of baking every block
    monkeypatch.setattr(orion.runtime, "compile_budget",
                        lambda: orion.runtime.compile_count() + left)
    step = LoraStep(cfg, weights, adapter, 16, backend)
    try:
        assert step.strategy == "inputs" and step.compiles == 4   # layer and final norm
    finally:
        step.release()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["Qwen2.5-0.5B", "Qwen3-0.6B"])
def test_qwen_a_and_b_gradients_equal_peft(tmp_path, backend, family):
    """LoRA training on Qwen-shaped models (q/k/v biases; per-head q/k norms and an
    explicit head_dim; grouped-query attention): the gradients PEFT gives."""
    from models.hf_fixtures import save_hf_model, shrunk

    config = {**shrunk(family), "vocab_size": 2048, "num_hidden_layers": 2,
              "bos_token_id": 0, "eos_token_id": 1}
    base = save_hf_model(tmp_path / "base", config, seed=5)
    ad_dir = peft_adapter(base, tmp_path / "ad", seed=6, targets=tuple(MODULES), r=4,
                          alpha=8.0)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 2048, (2, SEQ))
    targets = rng.integers(0, 2048, (2, SEQ))
    mask = np.ones((2, SEQ), np.int64)
    ref_loss, ref = peft_grads(base, ad_dir, tokens, targets, mask)
    arch, weights = load_hf(base)
    adapter = load_adapter(ad_dir, arch)
    step = LoraStep(arch, weights, adapter, SEQ, backend)
    try:
        out = step(adapter, tokens, targets, mask)
    finally:
        step.release()
    assert out.loss == pytest.approx(ref_loss, abs=1e-2)
    assert set(out.grads) == set(ref)
    for name, g in ref.items():
        err = np.linalg.norm(out.grads[name] - g) / np.linalg.norm(g)
        assert err < REL, (name, err)
