"""Class 16: adapter and model files that used to hang or raise raw errors, through
public entry points only (orion.load, `orion fuse`): the loaders behind them are being
rewritten (issue 28), and these must hold across it.

- a rank_pattern / alpha_pattern key that backtracks catastrophically ("(.*)*x") hung
  the adapter load for more than 60 s: refused by name;
- r: "4" and r: 8.5 were cast silently: refused;
- safetensors files whose tensors overlap (a regression), a header nested 100k deep
  (RecursionError), a shape [-4, -192] (numpy's ValueError): ModelLoadErrors;
- "model_type": ["gpt2"] raised a TypeError: a ModelLoadError;
- generating after close was a plain ValueError for Llama: a StateError, every model.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from child_process import OUTSIDE, child_env

import orion
from hostile.helpers import (
    adapter_tensors,
    peft_config,
    raw_safetensors,
    shipped_model,
    write_adapter,
    write_gpt2_folder,
)
from orion.errors import OrionError, StateError


def _load_adapter(folder):
    model, _ = orion.load(shipped_model(), adapter_path=folder)
    model.close()


@pytest.mark.parametrize("field", ["rank_pattern", "alpha_pattern"])
def test_a_catastrophic_pattern_is_refused_by_name_not_run(tmp_path, field):
    """In a child with a deadline: on a tree without the check it runs for hours."""
    value = 4 if field == "rank_pattern" else 8.0
    ad = write_adapter(tmp_path / "ad", peft_config(**{field: {"(.*)*x": value}}))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "orion.cli", "fuse", "--adapter-path", str(ad), "--out",
             str(tmp_path / "out")], cwd=OUTSIDE, env=child_env(), capture_output=True,
            text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("loading the adapter ran past 30 s")
    assert proc.returncode == 2, proc.stderr
    assert "(.*)*x" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("r", ["4", 8.5, True, None])
def test_a_rank_that_is_not_an_integer_is_refused(tmp_path, r):
    ad = write_adapter(tmp_path / "ad", peft_config(r=r))
    with pytest.raises(OrionError, match=r"\br\b"):
        _load_adapter(ad)


def _a_and_b_of_layer_0():
    t = adapter_tensors()
    stem = "base_model.model.model.layers.0.self_attn.q_proj"
    return t, f"{stem}.lora_A.weight", f"{stem}.lora_B.weight"


def test_overlapping_tensors_are_refused(tmp_path):
    """lora_A and lora_B of layer 0 point at the same bytes: writing one would change
    the other. The rest of the file is laid out normally."""
    tensors, a, b = _a_and_b_of_layer_0()
    header, blobs, at = {}, [], 0
    for name, arr in tensors.items():
        if name == b:
            continue
        data = arr.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header[b] = {**header[a], "shape": list(tensors[b].shape)}   # A's bytes, B's shape
    raw = raw_safetensors(header, b"".join(blobs))
    with pytest.raises(OrionError, match="overlap"):
        _load_adapter(write_adapter(tmp_path / "ad", raw_weights=raw))


@pytest.mark.parametrize("header", [
    '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "[" * 100_000,
])
def test_a_deeply_nested_header_is_refused(tmp_path, header):
    raw = raw_safetensors(header, b"")
    with pytest.raises(OrionError, match="adapter_model.safetensors"):
        _load_adapter(write_adapter(tmp_path / "ad", raw_weights=raw))


@pytest.mark.parametrize("shape", [[-4, -192], [2, -192], [2**62, 2**62]])
def test_a_negative_or_huge_shape_is_refused(tmp_path, shape):
    tensors, a, _ = _a_and_b_of_layer_0()
    header, blobs, at = {}, [], 0
    for name, arr in tensors.items():
        data = arr.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": shape if name == a else list(arr.shape),
                        "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    raw = raw_safetensors(header, b"".join(blobs))
    with pytest.raises(OrionError, match="shape"):
        _load_adapter(write_adapter(tmp_path / "ad", raw_weights=raw))


@pytest.mark.parametrize("model_type", [["gpt2"], {"gpt2": 1}, 7, None])
def test_a_model_type_that_is_not_a_string_is_a_model_load_error(tmp_path, model_type):
    folder = write_gpt2_folder(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    with pytest.raises(OrionError, match="model_type"):
        model, _ = orion.load(folder)
        model.close()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generate_after_close_is_a_state_error(tmp_path, arch):
    model, _ = orion.load(shipped_model() if arch == "llama"
                          else write_gpt2_folder(tmp_path / "m"))
    model.close()
    with pytest.raises(StateError):
        orion.generate(model, "hi", max_tokens=2)


@pytest.mark.slow
def test_finite_adapter_values_within_range_still_load(tmp_path):
    """The checks refuse garbage only: a small adapter changes the logits and loads."""
    model, tok = orion.load(shipped_model(), adapter_path=write_adapter(
        tmp_path / "ad", tensors={k: v * 50 for k, v in adapter_tensors().items()}))
    try:
        assert np.isfinite(model.prefill(tok.encode("ROMEO:"))).all()
    finally:
        model.close()
