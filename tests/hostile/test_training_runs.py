"""Class 7: training runs are exact and safe. Resume after SIGINT at random points is
bit-identical to an uninterrupted run; one trainer per run folder; an existing run is
not overwritten without --overwrite; a killed writer's temp files are cleaned (only
ours); --steps is honoured; a failed run leaves no folder it created."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from child_process import child_env

from hostile.helpers import small_corpus, tiny_train_config
from orion.train.checkpoint import CHECKPOINT, load_checkpoint
from orion.train.run_folder import RunFolderError
from orion.train.trainer import Trainer

STEPS = 10


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return small_corpus(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data):
    """(losses, final weights) of a run that was never stopped."""
    out = tmp_path_factory.mktemp("full") / "out"
    tr = Trainer(tiny_train_config(steps=STEPS, backend="vane"), data, out, progress=False)
    try:
        recs = tr.fit()
    finally:
        tr.close()
    return [r.loss for r in recs], load_checkpoint(out / CHECKPOINT).weights


PHASES = ("draw", "device", "optimizer", "update")


def _signal_inside(trainer: Trainer, step: int, phase: str, signum: int) -> None:
    """Sends `signum` to this process inside optimizer step `step`, right after the
    part of the step named by `phase`: the batch drawn, the forward/backward run, the
    AdamW update, or the weights pushed to the programs."""
    owner, name = {"draw": (trainer.batches, "next"), "device": (trainer, "device_step"),
                   "optimizer": (trainer.opt, "step"),
                   "update": (trainer.programs, "update")}[phase]
    real = getattr(owner, name)

    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        if trainer.step == step:
            os.kill(os.getpid(), signum)
        return out

    setattr(owner, name, wrapped)


@pytest.mark.slow
@pytest.mark.parametrize("point", range(10))
def test_resume_after_sigint_at_a_random_point_is_bit_identical(tmp_path, data, uninterrupted,
                                                                point):
    """The probe's case: a signal inside a step saved step 43 with 44 batches drawn."""
    expect_losses, expect_weights = uninterrupted
    rng = np.random.default_rng(point)
    step, phase = int(rng.integers(0, STEPS - 1)), str(rng.choice(PHASES))
    signum = signal.SIGTERM if point % 3 == 2 else signal.SIGINT
    cfg = tiny_train_config(steps=STEPS, backend="vane")
    out = tmp_path / "out"
    first = Trainer(cfg, data, out, progress=False)
    try:
        _signal_inside(first, step, phase, signum)
        with pytest.raises(KeyboardInterrupt):
            first.fit()
        losses = [r.loss for r in first.records]
    finally:
        first.close()
    ck = load_checkpoint(out / CHECKPOINT)
    # stopped after the step in progress; its step and data position agree
    assert ck.meta["step"] == len(losses) == step + 1
    assert ck.meta["data"]["drawn"] == ck.meta["step"] * cfg.grad_accum
    second = Trainer(cfg, data, out, resume=True, progress=False)
    try:
        losses += [r.loss for r in second.fit()]
    finally:
        second.close()
    assert losses == expect_losses
    final = load_checkpoint(out / CHECKPOINT).weights
    assert final.keys() == expect_weights.keys()
    for name in final:
        np.testing.assert_array_equal(final[name], expect_weights[name], err_msg=name)


def test_a_second_signal_stops_at_once_and_keeps_the_last_checkpoint(tmp_path, data):
    cfg = tiny_train_config(steps=STEPS, backend="vane", checkpoint_every=2)
    tr = Trainer(cfg, data, tmp_path / "out", progress=False)
    real = tr.device_step

    def twice(*args, **kwargs):
        if tr.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    tr.device_step = twice
    try:
        with pytest.raises(KeyboardInterrupt):
            tr.fit()
    finally:
        tr.close()
    ck = load_checkpoint(tmp_path / "out" / CHECKPOINT)
    assert ck.meta["step"] == 2 and ck.meta["data"]["drawn"] == 2   # the periodic one


def test_a_second_trainer_on_the_same_folder_is_refused(tmp_path, data):
    cfg = tiny_train_config(steps=2, backend="vane")
    first = Trainer(cfg, data, tmp_path / "out", progress=False)
    try:
        with pytest.raises(RunFolderError, match="another trainer"):
            Trainer(cfg, data, tmp_path / "out", progress=False, overwrite=True)
        first.fit()
    finally:
        first.close()
    assert (tmp_path / "out" / CHECKPOINT).exists()   # the refused one removed nothing


@pytest.mark.slow
def test_a_second_trainer_in_another_process_is_refused(tmp_path, data):
    cfg = tiny_train_config(steps=2, backend="vane")
    first = Trainer(cfg, data, tmp_path / "out", progress=False)
    script = ("import sys; from orion.train.run_folder import RunFolder\n"
              "RunFolder(sys.argv[1], resume=False, overwrite=True, trained_tokenizer=True)\n")
    try:
        res = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")],
                             capture_output=True, text=True, env=child_env(), cwd=tmp_path)
    finally:
        first.close()
    assert res.returncode != 0 and "another trainer" in res.stderr


def test_an_existing_run_needs_resume_or_overwrite(tmp_path, data):
    cfg = tiny_train_config(steps=2, backend="vane")
    tr = Trainer(cfg, data, tmp_path / "out", progress=False)
    try:
        tr.fit()
    finally:
        tr.close()
    before = (tmp_path / "out" / CHECKPOINT).read_bytes()
    log = (tmp_path / "out" / "log.jsonl").read_text()
    with pytest.raises(RunFolderError, match="--resume.*--overwrite"):
        Trainer(cfg, data, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / CHECKPOINT).read_bytes() == before
    (tmp_path / "out" / "notes.txt").write_text("the user's")
    tr = Trainer(tiny_train_config(steps=3, backend="vane"), data, tmp_path / "out",
                 progress=False, overwrite=True)
    try:
        recs = tr.fit()
    finally:
        tr.close()
    assert len(recs) == 3
    lines = (tmp_path / "out" / "log.jsonl").read_text().splitlines()
    first = json.loads(log.splitlines()[0])
    steps = [json.loads(line) for line in lines if "loss" in json.loads(line)]
    assert len(steps) == 3 and steps[0]["loss"] == first["loss"]   # a fresh log
    assert (tmp_path / "out" / "notes.txt").read_text() == "the user's"


def test_stale_temp_files_are_cleaned_only_when_ours_and_dead(tmp_path, data):
    out = tmp_path / "out"
    out.mkdir()
    dead = 999_999_999
    ours_dead = [out / f".config.json.tmp-{dead}", out / f".loss.png.tmp-{dead}",
                 out / f".checkpoint.safetensors.tmp-{dead}"]
    for p in ours_dead:
        p.write_bytes(b"half written")
    live = out / f".checkpoint.safetensors.tmp-{os.getppid()}"   # a live writer's
    live.write_bytes(b"in progress")
    foreign = [out / ".config.json.tmp-x1", out / "config.json.tmp-123", out / "my.tmp-1"]
    for p in foreign:
        p.write_text("not ours")
    (out / "dir.tmp-5").mkdir()
    (out / ".d.tmp-7").mkdir()   # our pattern, but a folder: not ours
    tr = Trainer(tiny_train_config(steps=1, backend="vane"), data, out, progress=False)
    tr.close()
    assert not any(p.exists() for p in ours_dead)
    assert live.exists() and all(p.exists() for p in foreign)
    assert (out / "dir.tmp-5").is_dir() and (out / ".d.tmp-7").is_dir()


def test_steps_runs_that_many_more_even_past_the_config(tmp_path, data):
    tr = Trainer(tiny_train_config(steps=2, backend="vane"), data, tmp_path / "out",
                 progress=False)
    try:
        recs = tr.fit(steps=4)
    finally:
        tr.close()
    assert len(recs) == 4 and tr.step == 4
    assert recs[-1].lr == pytest.approx(tr.config.min_lr)


def test_the_cli_says_when_steps_pass_the_config(tmp_path, data, capsys):
    from orion.cli import main

    (tmp_path / "c.json").write_text(json.dumps(tiny_train_config(steps=1, backend="vane")
                                                .to_dict()))
    assert main(["train", "--config", str(tmp_path / "c.json"), "--data", str(data),
                 "--out", str(tmp_path / "out"), "--steps", "2", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "past the config's steps" in out.err
    assert json.loads(out.out.strip().splitlines()[-1])["steps"] == 2


@pytest.mark.parametrize("failure", ["config", "data", "tokenizer"])
def test_a_failed_run_leaves_no_folder_it_created(tmp_path, data, failure):
    short = {"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64, "max_seq_len": 8}
    kw = {"config": {"model": short}, "data": {}, "tokenizer": {"tokenizer": "/nonexistent"}}
    src = tmp_path / "empty.txt" if failure == "data" else data
    if failure == "data":
        src.write_text("")
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(Exception):  # noqa: B017 - which error is tested elsewhere
        Trainer(tiny_train_config(backend="vane", **kw[failure]), src, out, progress=False)
    assert not out.exists()


def test_a_failed_run_keeps_a_folder_it_did_not_create(tmp_path, data):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(Exception):  # noqa: B017
        Trainer(tiny_train_config(tokenizer="/nonexistent"), data, out, progress=False)
    assert (out / "mine.txt").read_text() == "keep"
