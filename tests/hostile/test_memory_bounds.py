"""Class 4: config values are checked against bounds and against the weights present
before anything is sized from them (a `n_layer` of 1e9 used to build a billion-entry
shape table; absurd llama2.c headers, training configs likewise)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile.helpers import GPT2_TINY
from orion.errors import ConfigError, ModelLoadError

HUGE = [10**9, 2**31 - 1, 2**40, 10**18]


def _with_config(src: Path, dst: Path, **change) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(change)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("field", ["n_layer", "n_positions", "n_embd", "vocab_size", "n_head",
                                   "n_inner"])
@pytest.mark.parametrize("value", HUGE)
def test_huge_gpt2_config_values_are_refused_before_allocating(tmp_path, gpt2_dir, field,
                                                               value):
    from orion.models.registry import open_hf as load_gpt2_weights

    folder = _with_config(gpt2_dir, tmp_path / "m", **{field: value})
    with pytest.raises(ModelLoadError, match=field):
        load_gpt2_weights(folder)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["n_layer", "n_positions", "n_embd", "vocab_size"]),
       value=st.integers(min_value=1, max_value=2**62))
def test_any_gpt2_size_is_refused_unless_the_weights_have_it(tmp_path_factory, gpt2_dir,
                                                             field, value):
    """A value the weights do not match is refused by name (bounds) or by shape; the
    check never allocates the config's sizes."""
    from orion.models.registry import open_hf as load_gpt2_weights

    if value == GPT2_TINY[field]:
        return
    folder = _with_config(gpt2_dir, tmp_path_factory.mktemp("m") / "m", **{field: value})
    with pytest.raises(ModelLoadError):
        load_gpt2_weights(folder)


def test_gpt2_n_positions_past_the_weights_cannot_pick_a_huge_bucket(tmp_path, gpt2_dir):
    """The probe's case for Llama was max_position_embeddings 1e9 making a 5,000-token
    prompt pick a 1e9 bucket; for GPT-2 the position table must match n_positions."""
    import orion

    folder = _with_config(gpt2_dir, tmp_path / "m", n_positions=2048)
    with pytest.raises(ModelLoadError, match="wpe"):
        orion.load(folder)


def _llama2c_v1(tmp_path: Path) -> Path:
    from models.llama_args import llama

    from orion.formats.llama2c import write_llama2c
    from orion.models.weights import init_weights

    arch = llama(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=50,
                 hidden_dim=40, max_seq_len=16)
    write_llama2c(tmp_path / "m.bin", arch.to_config(), init_weights(arch, 1), version=1)
    return tmp_path / "m.bin"


@pytest.mark.parametrize("index", range(7))
@pytest.mark.parametrize("value", [10**6, 2**31 - 1])
def test_huge_llama2c_header_fields_are_refused_by_the_file_size(tmp_path, index, value):
    from orion.formats.llama2c import read_llama2c

    path = _llama2c_v1(tmp_path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 8 + 4 * index, value)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError):
        read_llama2c(path)


@pytest.mark.parametrize("field", ["dim", "n_layers", "hidden_dim", "max_seq_len", "n_heads"])
def test_huge_training_model_is_refused_before_init(field):
    from hostile.helpers import tiny_train_config

    model = {"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64}
    model[field] = 10**9
    with pytest.raises(ConfigError, match=f"model.{field}|parameters"):
        tiny_train_config(model=model).validate()


def test_a_preset_times_a_huge_vocabulary_is_refused():
    from hostile.helpers import tiny_train_config

    with pytest.raises(ConfigError, match="vocab_size"):
        tiny_train_config(model="stories110M", vocab_size=10**9).validate()
