"""orion.lora.naming: the base model an adapter records."""

from __future__ import annotations

from pathlib import Path

import orion
from orion.lora.naming import SHIPPED_NAME, base_model_name


def default_model_path() -> Path:
    return Path(orion.__file__).resolve().parent / "assets" / "shakespeare-llama"


def test_the_shipped_model_is_recorded_by_name():
    assert base_model_name(default_model_path(), default_model_path()) == SHIPPED_NAME


def test_a_relative_path_becomes_absolute(tmp_path, monkeypatch):
    (tmp_path / "models" / "x").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "models")
    assert base_model_name("./x", default_model_path()) == str(tmp_path / "models" / "x")


def test_a_hub_snapshot_is_recorded_as_its_repo_id(tmp_path):
    snap = tmp_path / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert base_model_name(snap, default_model_path()) == "Qwen/Qwen3-0.6B"


def test_a_repo_id_stays_as_given():
    assert base_model_name("Qwen/Qwen3-0.6B", default_model_path()) == "Qwen/Qwen3-0.6B"
