"""Class 9: non-finite values are never served or written (issue 33's most serious
class: each case used to serve or write garbage with exit 0).

- an adapter with a NaN, inf or 1e30 value (one is enough), a lora_alpha of NaN,
  Infinity, 1e30 or -1e6, or A = B = 300 (whose product overflows fp16) is refused at
  load, naming the module: `orion generate --adapter-path` printed an empty line and
  exited 0, `orion fuse` wrote a NaN model;
- `orion lora --lr nan` trained and wrote 24,576 NaNs; every numeric option of
  `orion lora` and `orion train` is now checked when the command line is parsed;
- no writer (fuse, an adapter, a checkpoint) writes a value that is not finite in the
  dtype it writes.

Only public entry points here (orion.load, the CLI, file formats): the adapter loader
behind them is being rewritten (issue 28), and these must hold across it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hostile.helpers import (
    adapter_tensors,
    assert_one_line_error,
    peft_config,
    run_cli,
    shipped_model,
    write_adapter,
)
from orion.errors import OrionError

BAD_ADAPTERS = {
    "A holds NaN": (None, {"A": math.nan}),
    "B holds inf": (None, {"B": math.inf}),
    "A holds 1e30": (None, {"A": 1e30}),
    "lora_alpha NaN": ({"lora_alpha": math.nan}, None),
    "lora_alpha Infinity": ({"lora_alpha": math.inf}, None),
    "lora_alpha 1e30": ({"lora_alpha": 1e30}, None),
    "lora_alpha -1e6": ({"lora_alpha": -1e6}, None),
    "A = B = 300": (None, {"A": 300.0, "B": 300.0}),
}
def _bad_adapter(folder, case):
    config, values = BAD_ADAPTERS[case]
    tensors = adapter_tensors()
    for name in tensors:
        which = "A" if ".lora_A." in name else "B"
        if values and which in values:
            tensors[name][...] = values[which]
            if values[which] != 300.0:   # one bad value is enough
                tensors[name][...] = adapter_tensors()[name]
                tensors[name][0, 0] = values[which]
    return write_adapter(folder, peft_config(**(config or {})), tensors)


@pytest.mark.parametrize("case", list(BAD_ADAPTERS))
def test_bad_adapter_is_refused_at_load_naming_the_module(tmp_path, case):
    import orion

    ad = _bad_adapter(tmp_path / "ad", case)
    with pytest.raises(OrionError, match=r"q_proj|lora_alpha"):
        model, _ = orion.load(shipped_model(), adapter_path=ad)
        model.close()


@pytest.mark.parametrize("case", list(BAD_ADAPTERS))
def test_generate_with_a_bad_adapter_is_one_line_exit_2(tmp_path, capsys, case):
    ad = _bad_adapter(tmp_path / "ad", case)
    rc, out, err = run_cli(["generate", "ROMEO:", "--adapter-path", str(ad),
                            "--max-tokens", "4"], capsys)
    assert_one_line_error(rc, err, "generate")


@pytest.mark.parametrize("case", list(BAD_ADAPTERS))
def test_fuse_never_writes_a_bad_model(tmp_path, capsys, case):
    """Refused at load (the adapter loader checks every value and lora_alpha), so no
    folder is written."""
    ad = _bad_adapter(tmp_path / "ad", case)
    rc, _, err = run_cli(["fuse", "--adapter-path", str(ad), "--out", str(tmp_path / "f")],
                         capsys)
    assert_one_line_error(rc, err, "fuse")
    assert not (tmp_path / "f").exists()


# ---- numeric options of the training commands ------------------------------------

LORA_OPTIONS = [("--lr", "nan"), ("--lr", "inf"), ("--lr", "-1e-3"), ("--alpha", "nan"),
                ("--alpha", "0"), ("--dropout", "nan"), ("--dropout", "1.5"),
                ("--weight-decay", "nan"), ("--warmup", "-1"), ("--iters", "0"),
                ("--rank", "0"), ("--batch-size", "0"), ("--grad-accum", "0"),
                ("--max-seq-length", "0"), ("--seed", "-1"), ("--iters", "9" * 5000),
                ("--val-batches", "-2"), ("--save-every", "-1")]


@pytest.mark.parametrize(("option", "value"), LORA_OPTIONS)
def test_lora_numeric_options_are_checked_at_parse(tmp_path, capsys, option, value):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "hello there"}\n')
    (data / "valid.jsonl").write_text('{"text": "hello there"}\n')
    rc, _, err = run_cli(["lora", "--data", str(data), "--adapter-path",
                          str(tmp_path / "out"), option, value, "--no-progress"], capsys)
    line = assert_one_line_error(rc, err, "lora")
    assert option in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field", ["lr", "min_lr", "weight_decay", "alpha", "dropout",
                                   "loss_scale"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_lora_train_config_refuses_non_finite_and_negative(field, value):
    from orion.lora.trainer import LoraTrainConfig

    with pytest.raises(OrionError, match=field):
        LoraTrainConfig(**{field: value})


@pytest.mark.parametrize("value", ["nan", "-3", "1e3"])
def test_train_steps_is_checked_at_parse(tmp_path, capsys, value):
    rc, _, err = run_cli(["train", "--config", str(tmp_path / "c.json"), "--data",
                          str(tmp_path / "d.txt"), "--out", str(tmp_path / "out"),
                          "--steps", value], capsys)
    assert "--steps" in assert_one_line_error(rc, err, "train")
    assert not (tmp_path / "out").exists()


# ---- the one safetensors writer -----------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e39])
def test_the_writer_refuses_values_not_finite_in_its_dtype(dtype, value):
    from orion.formats.safetensors import save

    x = np.ones((4, 4), np.float64)
    x[1, 2] = value
    with np.errstate(over="ignore"):   # 1e39 is inf in fp32 already
        x = x.astype(np.float32)
    with pytest.raises(OrionError, match="w.*not finite"):
        save({"w": x}, dtype)


def test_past_fp16_is_refused_in_float16_only():
    from orion.formats.safetensors import save

    x = np.full((2, 2), 70000.0, np.float32)
    with pytest.raises(OrionError, match="float16"):
        save({"w": x}, "float16")
    assert save({"w": x}, "float32") and save({"w": x}, "bfloat16")
