"""The device training step (layer programs on vane, host head and dW) against PyTorch
autograd in fp32 on the same weights and batch."""

from __future__ import annotations

import numpy as np
import pytest
from models.llama_args import llama

from orion.models.weights import init_weights
from orion.train.step import DeviceStep
from orion.train.update import TrainPrograms

ARCH = llama(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, hidden_dim=96,
             max_seq_len=32, tie_embeddings=False)
CFG = ARCH.args


def programs_for(cfg, w, seq, strategy, backend) -> TrainPrograms:
    return TrainPrograms(ARCH, w, seq, strategy, backend)


def _weights(cfg) -> dict[str, np.ndarray]:
    w = init_weights(ARCH, 11)
    rng = np.random.default_rng(12)
    for k, v in w.items():
        if v.ndim == 1:
            w[k] = (1.0 + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
    return w


def _batch(cfg, seq: int = 32, batch: int = 2):
    rng = np.random.default_rng(3)
    return (rng.integers(0, cfg.vocab_size, (batch, seq)),
            rng.integers(0, cfg.vocab_size, (batch, seq)))


@pytest.mark.parametrize("strategy", ["delta", "inputs"])
def test_gradients_match_torch_fp32(strategy, backend):
    torch = pytest.importorskip("torch", reason="PyTorch autograd is the reference")
    from models.llama_torch import hf_model

    w = _weights(CFG)
    tokens, targets = _batch(CFG)
    programs = programs_for(CFG, w, 32, strategy, backend)
    try:
        out = DeviceStep(ARCH, programs)(w, tokens, targets, loss_scale=1024.0)
    finally:
        programs.release()
    model = hf_model(CFG, w, "float32")
    logits = model(torch.from_numpy(tokens)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab_size),
                                             torch.from_numpy(targets).reshape(-1))
    loss.backward()
    assert out.loss == pytest.approx(loss.item(), abs=1e-2)
    assert not out.counts.overflow
    params = dict(model.named_parameters())
    assert set(out.grads) == set(ARCH.parameters())
    for name, g in out.grads.items():
        ref = params[name].grad.numpy()
        scale = np.abs(ref).max()
        assert np.abs(g - ref).max() <= 1e-2 * scale, name
        cos = float((g * ref).sum() / (np.linalg.norm(g) * np.linalg.norm(ref)))
        assert cos > 0.9995, (name, cos)


def test_strategies_give_the_same_step(backend):
    w = _weights(CFG)
    tokens, targets = _batch(CFG)
    results = []
    for strategy in ("delta", "inputs"):
        programs = programs_for(CFG, w, 32, strategy, backend)
        try:
            results.append(DeviceStep(ARCH, programs)(w, tokens, targets, 1024.0))
        finally:
            programs.release()
    a, b = results
    assert a.loss == pytest.approx(b.loss, abs=1e-3)
    for k in a.grads:
        scale = np.abs(a.grads[k]).max()
        assert np.abs(a.grads[k] - b.grads[k]).max() <= 1e-2 * scale, k


def test_non_finite_forward_is_reported(backend):
    w = _weights(CFG)
    w["model.layers.0.mlp.up_proj.weight"][0, :] = 60000.0  # activations overflow fp16
    tokens, targets = _batch(CFG)
    programs = programs_for(CFG, w, 32, "delta", backend)
    try:
        out = DeviceStep(ARCH, programs)(w, tokens, targets, 1024.0)
    finally:
        programs.release()
    assert out.counts.overflow


def test_step_reuses_its_buffers_and_accumulates(backend):
    """Gradients live in the step's buffers: a second call overwrites them, and with
    accumulate=True it adds to them (micro-batches of gradient accumulation)."""
    w = _weights(CFG)
    tokens, targets = _batch(CFG, batch=1)
    programs = programs_for(CFG, w, 32, "inputs", backend)
    try:
        step = DeviceStep(ARCH, programs)
        first = step(w, tokens, targets, 1024.0)
        once = {k: v.copy() for k, v in first.grads.items()}
        again = step(w, tokens, targets, 1024.0)
        assert all(again.grads[k] is first.grads[k] for k in once)
        for k, g in once.items():
            np.testing.assert_array_equal(again.grads[k], g, err_msg=k)
        twice = step(w, tokens, targets, 1024.0, accumulate=True)
        for k, g in once.items():
            np.testing.assert_array_equal(twice.grads[k], 2 * g, err_msg=k)
    finally:
        programs.release()


def test_accumulated_micro_batches_match_one_batch(backend):
    """Two micro-batches of one sequence, accumulated, are twice the gradient of the
    batch of both (whose loss is the mean over its sequences)."""
    w = _weights(CFG)
    tokens, targets = _batch(CFG, batch=2)
    programs = programs_for(CFG, w, 32, "delta", backend)
    try:
        step = DeviceStep(ARCH, programs)
        whole = {k: v.copy() for k, v in step(w, tokens, targets, 1024.0).grads.items()}
        step(w, tokens[:1], targets[:1], 1024.0)
        acc = step(w, tokens[1:], targets[1:], 1024.0, accumulate=True).grads
    finally:
        programs.release()
    for k, g in whole.items():
        scale = np.abs(g).max()
        assert np.abs(acc[k] - 2 * g).max() <= 2e-2 * scale, k


def test_forward_only_loss_matches_torch_and_the_step(backend):
    """Validation's loss: forward programs only, the same number the step reports."""
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    from models.llama_torch import hf_model

    w = _weights(CFG)
    tokens, targets = _batch(CFG)
    programs = programs_for(CFG, w, 32, "inputs", backend)
    try:
        step = DeviceStep(ARCH, programs)
        val = step.loss(w, tokens, targets)
        trained = step(w, tokens, targets, 1024.0).loss
    finally:
        programs.release()
    with torch.no_grad():
        logits = hf_model(CFG, w, "float32")(torch.from_numpy(tokens)).logits
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab_size),
                                                torch.from_numpy(targets).reshape(-1))
    assert val == pytest.approx(ref.item(), abs=1e-2)
    assert val == pytest.approx(trained, abs=1e-6)
