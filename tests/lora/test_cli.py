"""`orion lora`, then `orion generate --adapter-path` on what it wrote."""

from __future__ import annotations

import json

import pytest

from lora.test_trainer import modern_text, write_data
from orion.cli import main


@pytest.mark.slow
def test_lora_then_generate_with_the_adapter(tmp_path, capsys):
    data = write_data(tmp_path / "data", modern_text(), n_train=4, n_valid=2, size=100)
    out = tmp_path / "ad"
    (data / "test.jsonl").write_text((data / "valid.jsonl").read_text())
    assert main(["lora", "--data", str(data), "--adapter-path", str(out), "--iters", "2",
                 "--max-seq-length", "24", "--batch-size", "2", "--rank", "2", "--lr", "1e-2",
                 "--val-every", "1", "--no-progress", "--test"]) == 0
    printed = capsys.readouterr().out
    assert "step 2: train loss" in printed and "test loss" in printed
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["r"] == 2 and cfg["target_modules"] == ["q_proj", "v_proj"]
    assert main(["generate", "ROMEO:", "--adapter-path", str(out), "--max-tokens", "5"]) == 0
    assert main(["lora", "--data", str(data), "--adapter-path", str(out)]) == 2
    assert "holds an adapter" in capsys.readouterr().err
    assert main(["lora", "--data", str(tmp_path), "--adapter-path", str(tmp_path / "b")]) == 2
    assert "no train.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()   # the failed run's folder goes again


def test_lora_caps_the_context_and_names_the_base(tmp_path, capsys):
    """The default --max-seq-length (2048) against the shipped model's 256-token context:
    a notice, and sequences cut there; the adapter names its base so that PEFT finds it
    from any folder; nothing of Orion's lock stays in the adapter folder."""
    data = write_data(tmp_path / "data", modern_text(), n_train=2, n_valid=1, size=100)
    out = tmp_path / "ad"
    assert main(["lora", "--data", str(data), "--adapter-path", str(out), "--iters", "1",
                 "--batch-size", "1", "--val-batches", "1", "--rank", "2",
                 "--no-progress"]) == 0
    assert "past the model's context of 256 tokens" in capsys.readouterr().err
    from orion.lora.naming import SHIPPED_NAME

    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == SHIPPED_NAME
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "adapter_config.json", "adapter_model.safetensors", "training_state.safetensors",
        "log.jsonl", "loss.png"])


def test_lora_help_explains_every_option_and_the_data_formats(capsys):
    import argparse

    import pytest

    from orion.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    lora = sub.choices["lora"]
    undocumented = [a.option_strings for a in lora._actions if not a.help]
    assert not undocumented
    with pytest.raises(SystemExit):
        main(["lora", "--help"])
    text = capsys.readouterr().out
    for shown in ('{"text": ', '{"prompt": ', '"completion": ', '{"messages": '):
        assert shown in text
