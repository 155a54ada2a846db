from __future__ import annotations

import numpy as np
import pytest

from orion.train.optim import AdamW, clip_grad_norm
from orion.train.schedule import cosine_lr


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch", reason="torch.optim.AdamW is the reference")
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((5, 4)).astype(np.float32),
              "g": rng.standard_normal(4).astype(np.float32)}
    tw = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    opt_t = torch.optim.AdamW([{"params": [tw["w"]], "weight_decay": 0.1},
                               {"params": [tw["g"]], "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    opt = AdamW(params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(5):
        grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
        lr = 1e-2 * (step + 1) / 5
        for group in opt_t.param_groups:
            group["lr"] = lr
        for k, p in tw.items():
            p.grad = torch.from_numpy(grads[k].copy())
        opt_t.step()
        opt.step(params, grads, lr)
    for k in params:
        np.testing.assert_allclose(params[k], tw[k].detach().numpy(), rtol=1e-5, atol=1e-6)


def test_clip_grad_norm_scales_to_max():
    grads = {"a": np.full(4, 3.0, np.float32), "b": np.full(1, 4.0, np.float32)}
    norm = clip_grad_norm(grads, 1.0)
    assert norm == pytest.approx(np.sqrt(36 + 16))
    total = np.sqrt(sum(float((g**2).sum()) for g in grads.values()))
    assert total == pytest.approx(1.0, rel=1e-5)
    small = {"a": np.full(4, 0.1, np.float32)}
    clip_grad_norm(small, 1.0)
    np.testing.assert_array_equal(small["a"], np.full(4, 0.1, np.float32))


def test_cosine_schedule_warms_up_then_decays():
    lrs = [cosine_lr(s, 1.0, 10, 110, 0.1) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55)
    assert all(a >= b for a, b in zip(lrs[10:110], lrs[11:111], strict=True))
    assert lrs[110] == lrs[119] == 0.1
