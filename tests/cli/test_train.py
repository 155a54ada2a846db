"""`orion train`: the summary it prints carries the final validation loss; its help names
the command that runs what it trains."""

from __future__ import annotations

import json

import pytest
from asset_paths import require_asset

from orion.cli import main
from orion.models import default_model_path

pytestmark = pytest.mark.native


@pytest.mark.slow
def test_summary_has_the_final_validation_loss(tmp_path, capsys):
    config = {"model": {"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64},
              "tokenizer": str(default_model_path() / "tokenizer.model"), "batch_size": 2,
              "seq_len": 32, "steps": 3, "warmup": 1, "checkpoint_every": 0, "val_every": 2,
              "val_batches": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    corpus = require_asset("text/tinyshakespeare_input.txt")
    assert main(["train", "--config", str(tmp_path / "config.json"), "--data", str(corpus),
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    val = [r for r in log if "val_loss" in r]
    assert [r["step"] for r in val] == [2, 3]
    assert summary["final_val_loss"] == val[-1]["val_loss"]


def test_help_names_the_command_that_runs_the_trained_model(capsys):
    """`orion generate DIR` would run the shipped model with "DIR" as the prompt."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "orion generate --model OUT" in out and "orion generate DIR" not in out
