"""LoRA fine-tuning runs: validation loss goes down on held-out text, resume is exact,
and an adapter Orion trained loads in PEFT with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import orion
from lora.conftest import MODULES, peft_logits
from orion.errors import LoraError
from orion.lora.trainer import STATE, LoraTrainConfig, LoraTrainer
from orion.models import default_model_path

MODERN = Path(__file__).resolve().parents[3] / "shared/assets/text/shakespeare_gut_modern.txt"


def write_data(folder: Path, text: str, n_train: int = 48, n_valid: int = 12,
               size: int = 300) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    chunks = [text[i:i + size] for i in range(0, size * (n_train + n_valid), size)]
    for name, part in (("train", chunks[:n_train]), ("valid", chunks[n_train:])):
        (folder / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": c}) + "\n" for c in part))
    return folder


def modern_text() -> str:
    if MODERN.exists():   # Gutenberg's Shakespeare, not the Tiny Shakespeare the model saw
        return MODERN.read_text(encoding="utf-8")[200_000:260_000]
    # the asset lives beside the checkout (../shared); without it, a text of our own
    return ("Thou art more lovely and more temperate. " * 40
            + "Rough winds do shake the darling buds of May. " * 40) * 20


@pytest.mark.slow
def test_fine_tune_lowers_validation_loss_on_held_out_text(tmp_path, backend):
    data = write_data(tmp_path / "data", modern_text())
    cfg = LoraTrainConfig(iters=12, batch_size=4, lr=3e-3, max_seq_length=64, val_every=0,
                          rank=8, alpha=16, targets=tuple(MODULES))
    tr = LoraTrainer(default_model_path(), data, tmp_path / "out", cfg, backend=backend,
                     progress=False)
    try:
        before = tr.evaluate()
        records = tr.fit()
    finally:
        tr.close()
    after = records[-1].extra["val_loss"]
    assert after < before - 0.1, (before, after)
    log = [json.loads(ln) for ln in (tmp_path / "out/log.jsonl").read_text().splitlines()]
    assert log[0] == {"step": 0, "val_loss": pytest.approx(before)}
    assert [r["step"] for r in log[1:]] == list(range(1, 13))
    assert (tmp_path / "out/loss.png").read_bytes()[:4] == b"\x89PNG"


def _run(model_dir: Path, data: Path, out: Path, iters: int, resume: bool, backend: str
         ) -> None:
    cfg = LoraTrainConfig(iters=iters, batch_size=2, grad_accum=2, lr=1e-2, max_seq_length=32,
                          val_every=2, rank=4, targets=("q_proj", "k_proj", "down_proj"),
                          lr_schedule="cosine", warmup=1, save_every=0, dropout=0.1)
    tr = LoraTrainer(model_dir, data, out, cfg, resume=resume, backend=backend, progress=False)
    try:
        tr.fit()
    finally:
        tr.close()


@pytest.mark.slow
def test_resume_is_bit_identical_to_a_straight_run(llama_dir, tmp_path, backend):
    from safetensors.numpy import load_file

    data = write_data(tmp_path / "data", modern_text(), n_train=10, n_valid=3, size=120)
    _run(llama_dir, data, tmp_path / "straight", 4, False, backend)
    half = LoraTrainConfig(iters=2, batch_size=2, grad_accum=2, lr=1e-2, max_seq_length=32,
                           val_every=2, rank=4, targets=("q_proj", "k_proj", "down_proj"),
                           lr_schedule="cosine", warmup=1, save_every=0, dropout=0.1)
    # the first half is a run of 4 interrupted after 2 steps (same schedule)
    tr = LoraTrainer(llama_dir, data, tmp_path / "resumed",
                     LoraTrainConfig(**{**half.__dict__, "iters": 4}), backend=backend,
                     progress=False)
    try:
        for _ in range(2):
            tr.train_step()
        tr.save()
    finally:
        tr.close()
    _run(llama_dir, data, tmp_path / "resumed", 4, True, backend)
    a = load_file(str(tmp_path / "straight/adapter_model.safetensors"))
    b = load_file(str(tmp_path / "resumed/adapter_model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    sa = load_file(str(tmp_path / "straight" / STATE))
    sb = load_file(str(tmp_path / "resumed" / STATE))
    for k in sa:
        assert np.array_equal(sa[k], sb[k]), k
    loss = lambda p: [json.loads(ln)["loss"] for ln in  # noqa: E731
                      (p / "log.jsonl").read_text().splitlines() if '"loss"' in ln]
    assert loss(tmp_path / "straight")[2:] == loss(tmp_path / "resumed")[-2:]
    assert np.any(a["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"])


def test_resume_with_other_hyper_parameters_is_refused(llama_dir, tmp_path, backend):
    data = write_data(tmp_path / "data", modern_text(), n_train=4, n_valid=2, size=100)
    _run(llama_dir, data, tmp_path / "out", 1, False, backend)
    cfg = LoraTrainConfig(iters=2, rank=8, max_seq_length=32, batch_size=2, grad_accum=2,
                          targets=("q_proj", "k_proj", "down_proj"))
    with pytest.raises(LoraError, match="rank"):
        LoraTrainer(llama_dir, data, tmp_path / "out", cfg, resume=True, backend=backend)


@pytest.mark.slow
def test_orion_trained_adapter_loads_in_peft_with_the_same_logits(llama_dir, tmp_path,
                                                                  backend):
    data = write_data(tmp_path / "data", modern_text(), n_train=8, n_valid=2, size=120)
    _run(llama_dir, data, tmp_path / "out", 3, False, backend)
    ids = list(np.random.default_rng(1).integers(0, 2048, 64))
    ref = peft_logits(llama_dir, tmp_path / "out", ids)
    base = peft_logits(llama_dir, None, ids)
    model, _ = orion.load(llama_dir, adapter_path=tmp_path / "out", backend=backend)
    got = model.prefill(ids, all_logits=True)
    model.close()
    assert np.abs(ref - base).max() > 0.05            # the training moved the model
    assert np.abs(got - ref).max() < 2e-2


def test_a_batch_is_padded_to_its_own_longest_row(tmp_path, backend):
    """One long training example makes the run's longest row long; the short
    validation rows still run at the smallest bucket, not at that length."""
    text = modern_text()
    data = write_data(tmp_path / "data", text, n_train=3, n_valid=2, size=60)
    with open(data / "train.jsonl", "a") as f:
        f.write(json.dumps({"text": text[:1200]}) + "\n")
    cfg = LoraTrainConfig(iters=1, batch_size=2, max_seq_length=200, rank=2)
    tr = LoraTrainer(default_model_path(), data, tmp_path / "out", cfg, backend=backend,
                     progress=False)
    try:
        tr.evaluate()
        assert tr.seq == 200
        assert [r.seq for r in tr.runners] == [32]
    finally:
        tr.close()
