"""The training loop end to end on the real Shakespeare corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orion.train.config import TrainConfig
from orion.train.trainer import Trainer

FINAL_NORM = "model.norm.weight"


def small_config(backend: str, sp_model, **kw) -> TrainConfig:
    base = dict(model={"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64},
                tokenizer=str(sp_model), batch_size=2, seq_len=32, steps=1000, lr=3e-3,
                min_lr=3e-4, warmup=20, checkpoint_every=0, backend=backend, seed=3)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.slow
def test_1000_steps_finite_falling_and_no_recompile(tmp_path, backend, shakespeare, sp_model):
    if backend == "reference":
        pytest.skip("1,000 steps on the numpy reference are too slow; runs on vane and ane")
    from orion.runtime import compile_count

    cfg = small_config(backend, sp_model, update="delta")
    tr = Trainer(cfg, shakespeare, tmp_path, progress=False)
    after_compile = compile_count()
    assert tr.compiles == 2 * (2 + 1)  # forward and backward per block, compiled once
    try:
        recs = tr.fit()
    finally:
        tr.close()
    assert compile_count() == after_compile
    assert len(recs) == 1000
    assert all(np.isfinite(r.loss) and r.skipped is None for r in recs)
    first = np.mean([r.loss for r in recs[:50]])
    last = np.mean([r.loss for r in recs[-50:]])
    assert last < first - 1.0, (first, last)
    assert all(r.update_ms > 0 for r in recs)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    val = [r for r in records if "val_loss" in r]
    assert len(train) == 1000 and train[-1]["step"] == 999
    assert [r["step"] for r in val] == list(range(100, 1001, 100))   # val_every=100
    assert val[-1]["val_loss"] < val[0]["val_loss"] - 0.5
    png = (tmp_path / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "config.json").exists() and (tmp_path / "model.safetensors").exists()


def _losses(recs) -> list[float]:
    return [r.loss for r in recs]


@pytest.mark.slow
@pytest.mark.parametrize("update", ["inputs", "delta"])
def test_resume_is_bit_identical(tmp_path, backend, shakespeare, sp_model, update):
    n = 4
    cfg = small_config(backend, sp_model, steps=2 * n, update=update, warmup=2)
    full = Trainer(cfg, shakespeare, tmp_path / "full", progress=False)
    try:
        expect = _losses(full.fit())
    finally:
        full.close()
    first = Trainer(cfg, shakespeare, tmp_path / "split", progress=False)
    try:
        part1 = _losses(first.fit(steps=n))
    finally:
        first.close()
    second = Trainer(cfg, shakespeare, tmp_path / "split", resume=True, progress=False)
    try:
        assert second.step == n
        part2 = _losses(second.fit())
    finally:
        second.close()
    assert part1 + part2 == expect  # bit-identical, not approximately equal
    # the validation at the end of the first part survives the resume, in log and history
    log = [json.loads(line) for line in (tmp_path / "split" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "val_loss" in r] == [n, 2 * n]
    assert [s for s, _ in second.val_history] == [n, 2 * n]


def test_validation_loss_is_logged_and_matches_torch(tmp_path, backend, shakespeare,
                                                     sp_model):
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    from models.llama_torch import hf_model

    cfg = small_config(backend, sp_model, steps=5, val_every=2, val_batches=2,
                       update="inputs")
    tr = Trainer(cfg, shakespeare, tmp_path, progress=False)
    try:
        tr.fit()
    finally:
        tr.close()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    assert [s for s, _ in val] == [2, 4, 5]          # every val_every steps and the end
    assert val == tr.val_history
    assert len(tr.val_windows) == 2
    first, last = tr.val_windows[0], tr.val_windows[-1]   # spread over the held-out end
    np.testing.assert_array_equal(first[0][0], tr.data.val[:cfg.seq_len])
    np.testing.assert_array_equal(last[1][-1], tr.data.val[-cfg.seq_len:])
    model = hf_model(tr.arch.args, tr.weights, "float32")
    with torch.no_grad():
        ref = np.mean([torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x)).logits.reshape(-1, tr.arch.args.vocab_size),
            torch.from_numpy(y).reshape(-1)).item() for x, y in tr.val_windows])
    assert val[-1][1] == pytest.approx(ref, abs=2e-2)


def test_ctrl_c_writes_a_checkpoint(tmp_path, backend, shakespeare, sp_model):
    cfg = small_config(backend, sp_model, steps=10, update="inputs")
    tr = Trainer(cfg, shakespeare, tmp_path, progress=False)

    def interrupt(rec):
        if rec.step == 2:
            raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            tr.fit(on_step=interrupt)
    finally:
        tr.close()
    resumed = Trainer(cfg, shakespeare, tmp_path, resume=True, progress=False)
    try:
        assert resumed.step == 3
        np.testing.assert_array_equal(resumed.weights[FINAL_NORM], tr.weights[FINAL_NORM])
    finally:
        resumed.close()


def test_non_finite_loss_skips_the_step(tmp_path, backend, shakespeare, sp_model):
    cfg = small_config(backend, sp_model, steps=3, update="inputs")
    tr = Trainer(cfg, shakespeare, tmp_path, progress=False)
    try:
        tr.weights[tr.arch.classifier_name][:, 0] = np.nan   # the host's classifier
        before = {k: v.copy() for k, v in tr.weights.items()}
        rec = tr.train_step()
        assert rec.skipped == "non-finite loss"
        for k, v in before.items():
            np.testing.assert_array_equal(tr.weights[k], v)
        assert tr.opt.t == 0
    finally:
        tr.close()


def test_strategies_give_the_same_losses(tmp_path, backend, shakespeare, sp_model):
    losses = {}
    for update in ("delta", "inputs"):
        cfg = small_config(backend, sp_model, steps=5, update=update)
        tr = Trainer(cfg, shakespeare, tmp_path / update, progress=False)
        try:
            losses[update] = _losses(tr.fit())
        finally:
            tr.close()
    np.testing.assert_allclose(losses["delta"], losses["inputs"], atol=2e-3)


def test_budget_is_checked_before_compiling(tmp_path, backend, shakespeare, sp_model):
    if backend == "reference":
        pytest.skip("the compile budget is the device's; runs on vane and ane")
    from orion.errors import CompileBudgetError
    from orion.runtime import compile_budget, compile_count, set_compile_budget

    old = compile_budget()
    set_compile_budget(compile_count() + 5)  # fewer than the 6 delta programs
    try:
        with pytest.raises(CompileBudgetError, match="inputs"):
            Trainer(small_config(backend, sp_model, update="delta"), shakespeare, tmp_path,
                    progress=False)
        before = compile_count()
        tr = Trainer(small_config(backend, sp_model, update="inputs", steps=2), shakespeare,
                     tmp_path, progress=False)
        try:
            assert compile_count() == before + 4
            tr.fit()
        finally:
            tr.close()
    finally:
        set_compile_budget(old)
