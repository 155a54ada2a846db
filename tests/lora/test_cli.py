"""`orion lora`, then `orion generate --adapter-path` on what it wrote."""

from __future__ import annotations

import json

from lora.test_trainer import modern_text, write_data
from orion.cli import main


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
