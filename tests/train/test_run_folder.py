"""orion.train.run_folder: the lock, the resume/overwrite rule, and the clean-up of a
folder a failed run created (without training anything)."""

from __future__ import annotations

import pytest

from orion.train.checkpoint import CHECKPOINT, CheckpointError
from orion.train.run_folder import LOCK, RUN_FILES, RunFolder, RunFolderError


def _open(path, **kw):
    return RunFolder(path, **{"resume": False, "overwrite": False, "trained_tokenizer": True,
                              **kw})


def test_lock_is_exclusive_and_released(tmp_path):
    first = _open(tmp_path / "r")
    with pytest.raises(RunFolderError, match="another trainer"):
        _open(tmp_path / "r")
    first.close()
    _open(tmp_path / "r").close()
    assert (tmp_path / "r" / LOCK).is_file()


def test_resume_needs_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint.safetensors"):
        _open(tmp_path / "r", resume=True)


def test_overwrite_removes_only_the_run_files(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    for name in (*RUN_FILES, "tokenizer.model"):
        (run / name).write_text("old")
    (run / "mine.txt").write_text("keep")
    with pytest.raises(RunFolderError, match="holds a run"):
        _open(run)
    _open(run, overwrite=True).close()
    assert sorted(p.name for p in run.iterdir()) == sorted([LOCK, "mine.txt"])


def test_a_given_tokenizer_survives_overwrite(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / CHECKPOINT).write_text("old")
    (run / "tokenizer.model").write_text("copied from the config")
    _open(run, overwrite=True, trained_tokenizer=False).close()
    assert (run / "tokenizer.model").exists() and not (run / CHECKPOINT).exists()


def test_failed_close_removes_only_a_folder_it_created(tmp_path):
    made = _open(tmp_path / "a" / "new")
    made.close(failed=True)
    assert not (tmp_path / "a" / "new").exists()
    (tmp_path / "old").mkdir()
    kept = _open(tmp_path / "old")
    kept.close(failed=True)
    assert (tmp_path / "old").is_dir()


def test_out_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunFolderError, match="not a folder"):
        _open(tmp_path / "f")
