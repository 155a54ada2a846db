"""The numpy Llama forward/backward against PyTorch autograd through transformers.

HF computes its RoPE angles in fp32 whatever the model dtype, so agreement is to about
1e-5 relative even in fp64."""

from __future__ import annotations

import numpy as np
import pytest

from orion.models.llama_config import LlamaConfig
from orion.models.llama_reference import forward, loss_and_grads
from orion.models.llama_weights import init_weights, param_shapes

from .llama_torch import hf_model

CONFIGS = [
    LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=61, hidden_dim=48,
                max_seq_len=16),
    LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=61, hidden_dim=48,
                max_seq_len=16, tie_embeddings=False),
]


def _random_weights(cfg: LlamaConfig, seed: int) -> dict[str, np.ndarray]:
    w = {k: v.astype(np.float64) for k, v in init_weights(cfg, seed).items()}
    rng = np.random.default_rng(seed + 1)
    for k, v in w.items():  # norms away from 1, so their gradients are tested too
        if v.ndim == 1:
            w[k] = 1.0 + 0.1 * rng.standard_normal(v.shape)
    return w


@pytest.mark.parametrize("cfg", CONFIGS, ids=["mha-tied", "gqa-untied"])
def test_gradients_match_torch_autograd(cfg):
    torch = pytest.importorskip("torch", reason="PyTorch autograd is the reference")
    w = _random_weights(cfg, 3)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, cfg.vocab_size, (2, 12))
    targets = rng.integers(0, cfg.vocab_size, (2, 12))
    loss, grads = loss_and_grads(cfg, w, tokens, targets)

    model = hf_model(cfg, w)
    logits = model(torch.from_numpy(tokens)).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                            torch.from_numpy(targets).reshape(-1))
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-6)
    params = dict(model.named_parameters())
    assert set(grads) == set(param_shapes(cfg))
    for name, g in grads.items():
        expected = params[name].grad.numpy()
        np.testing.assert_allclose(g, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max(),
                                   err_msg=name)


def test_logits_match_torch_forward():
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    cfg = CONFIGS[1]
    w = _random_weights(cfg, 5)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16))
    logits, _ = forward(cfg, w, tokens)
    with torch.no_grad():
        ref = hf_model(cfg, w)(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-6)


def test_cross_entropy_matches_torch_and_in_place_agrees():
    torch = pytest.importorskip("torch", reason="torch.nn.functional.cross_entropy is the "
                                "reference")
    from orion.models.llama_reference import cross_entropy

    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((7, 300)) * 4).astype(np.float32)
    targets = rng.integers(0, 300, 7)
    tl = torch.from_numpy(logits.copy()).requires_grad_()
    want = torch.nn.functional.cross_entropy(tl, torch.from_numpy(targets))
    (want * 64.0).backward()
    loss, d = cross_entropy(logits, targets, scale=64.0)
    assert loss == pytest.approx(want.item(), rel=1e-6)
    np.testing.assert_allclose(d, tl.grad.numpy(), rtol=1e-5, atol=1e-7)
    buf = logits.copy()
    loss2, d2 = cross_entropy(buf, targets, scale=64.0, in_place=True)
    assert loss2 == loss and np.shares_memory(d2, buf)
    np.testing.assert_array_equal(d2, d)
