"""orion.train.loss against torch's cross-entropy."""

from __future__ import annotations

import numpy as np
import pytest

from orion.train.loss import cross_entropy


def test_cross_entropy_matches_torch_and_in_place_agrees():
    torch = pytest.importorskip("torch", reason="torch.nn.functional.cross_entropy is the "
                                "reference")
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
