from __future__ import annotations

import numpy as np
import pytest

from orion.runtime.fp16 import to_fp16
from orion.train.optim import AdamW, clip_coef, clip_grad_norm, grad_norm
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


def test_adamw_matches_torch_across_work_items():
    """Large enough that the fused C pass splits it over several work items."""
    torch = pytest.importorskip("torch", reason="torch.optim.AdamW is the reference")
    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((300, 700)).astype(np.float32)}
    tw = torch.nn.Parameter(torch.from_numpy(params["w"].copy()))
    opt_t = torch.optim.AdamW([tw], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = AdamW(params, lr=3e-3)
    for _ in range(3):
        g = rng.standard_normal((300, 700)).astype(np.float32)
        tw.grad = torch.from_numpy(g.copy())
        opt_t.step()
        opt.step(params, {"w": g})
    np.testing.assert_allclose(params["w"], tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_adamw_grad_scale_is_the_scaled_gradient():
    rng = np.random.default_rng(2)
    w = {"w": rng.standard_normal((64, 33)).astype(np.float32)}
    a, b = {k: v.copy() for k, v in w.items()}, {k: v.copy() for k, v in w.items()}
    opt_a, opt_b = AdamW(a, lr=1e-2), AdamW(b, lr=1e-2)
    for _ in range(3):
        g = rng.standard_normal((64, 33)).astype(np.float32)
        opt_a.step(a, {"w": g * np.float32(0.25)})
        opt_b.step(b, {"w": g}, grad_scale=0.25)
    np.testing.assert_array_equal(a["w"], b["w"])
    np.testing.assert_array_equal(opt_a.v["w"], opt_b.v["w"])


def test_adamw_writes_the_fp16_copy_in_its_pass():
    rng = np.random.default_rng(3)
    shapes = {"big": (300, 700), "small": (5, 7), "norm": (33,)}   # several work items, tails
    w = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    plain = {k: v.copy() for k, v in w.items()}
    half = {k: np.full(s, np.nan, np.float16) for k, s in shapes.items() if k != "small"}
    opt, ref = AdamW(w, lr=1e-2), AdamW(plain, lr=1e-2)
    for _ in range(2):
        g = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        opt.step(w, g, half=half)
        ref.step(plain, g)
        for k, h in half.items():       # bit-exact: the same rounding as to_fp16
            np.testing.assert_array_equal(h.view(np.uint16), to_fp16(w[k]).view(np.uint16))
    for k in w:                         # and the update itself is unchanged
        np.testing.assert_array_equal(w[k], plain[k])


def test_adamw_names_a_wrong_fp16_copy():
    w = {"layer.w": np.zeros((4, 3), np.float32)}
    g = {"layer.w": np.zeros((4, 3), np.float32)}
    with pytest.raises(ValueError, match=r"layer\.w: fp16 copy"):
        AdamW(w).step(w, g, half={"layer.w": np.zeros((3, 4), np.float16)})
    with pytest.raises(ValueError, match=r"layer\.w: fp16 copy"):
        AdamW(w).step(w, g, half={"layer.w": np.zeros((4, 3), np.float32)})
    with pytest.raises(ValueError, match=r"layer\.w: the fp16 copy overlaps"):
        inside = w["layer.w"].view(np.float16).reshape(-1)[:12].reshape(4, 3)
        AdamW(w).step(w, g, half={"layer.w": inside})


def test_adamw_names_a_gradient_of_the_wrong_shape():
    w = {"layer.w": np.zeros((4, 3), np.float32)}
    with pytest.raises(ValueError, match=r"layer\.w"):
        AdamW(w).step(w, {"layer.w": np.zeros((3, 4), np.float32)})
    with pytest.raises(ValueError, match="C-contiguous"):
        f = {"layer.w": np.zeros((3, 4), np.float32).T}
        AdamW(f).step(f, {"layer.w": np.zeros((4, 3), np.float32)})


def test_clip_coef_and_grad_norm():
    grads = {"a": np.full(4, 3.0, np.float32), "b": np.full(1, 4.0, np.float32)}
    assert grad_norm(grads) == pytest.approx(np.sqrt(52))
    assert clip_coef(np.sqrt(52), 1.0) == pytest.approx(1 / np.sqrt(52), rel=1e-5)
    assert clip_coef(0.5, 1.0) == 1.0 and clip_coef(10.0, 0.0) == 1.0


def test_grad_norm_is_fp64_exact_and_the_same_on_any_thread_count():
    from orion.runtime import num_threads, set_num_threads

    rng = np.random.default_rng(4)
    grads = {"big": rng.standard_normal((700, 301)).astype(np.float32) * 1e3,   # many items
             "tail": rng.standard_normal(13).astype(np.float32), "none": np.zeros(0, np.float32)}
    want = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
    assert grad_norm(grads) == pytest.approx(want, rel=1e-13)
    before = num_threads()
    try:
        norms = []
        for threads in (1, 2, 3):
            set_num_threads(threads)
            norms.append(grad_norm(grads))
    finally:
        set_num_threads(before)
    assert norms[0] == norms[1] == norms[2]


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
