"""The numpy Llama forward/backward against PyTorch autograd through transformers.

HF computes its RoPE angles in fp32 whatever the model dtype, so agreement is to about
1e-5 relative even in fp64."""

from __future__ import annotations

import numpy as np
import pytest

from models.llama_args import llama
from models.llama_reference import forward, loss_and_grads
from orion.models.weights import init_weights

from .llama_torch import hf_model

ARCHS = [
    llama(dim=32, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=61, hidden_dim=48,
          max_seq_len=16),
    llama(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=61, hidden_dim=48,
          max_seq_len=16, tie_embeddings=False),
]
CONFIGS = [a.args for a in ARCHS]


def _random_weights(cfg, seed: int) -> dict[str, np.ndarray]:
    arch = next(a for a in ARCHS if a.args == cfg)
    w = {k: v.astype(np.float64) for k, v in init_weights(arch, seed).items()}
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
    assert set(grads) == set(next(a for a in ARCHS if a.args == cfg).parameters())
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
