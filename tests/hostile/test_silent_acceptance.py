"""Class 5: corrupt or mismatched input is refused, never accepted silently: token ids
and sampling options at the generate entry point (for every model), llama2.c headers
relabelled to another version, training configs, and checkpoints that do not match
the run they would resume (or are corrupt)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostile.helpers import small_corpus, tiny_train_config, write_gpt2_folder
from orion.errors import ConfigError, InvalidArgumentError, ModelLoadError

# ---- generate: token ids and options ------------------------------------------------


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request, tmp_path_factory):
    import orion
    from orion.models import default_model_path

    path = (write_gpt2_folder(tmp_path_factory.mktemp("gpt2")) if request.param == "gpt2"
            else default_model_path())
    m, _ = orion.load(path)
    yield m
    m.close()


def _vocab(model) -> int:
    return int(model.config.vocab_size)


@pytest.mark.parametrize("bad", ["negative", "vocab", "huge", "float", "bool", "str"])
def test_out_of_range_or_non_integer_token_ids_are_refused(model, bad):
    import orion

    ids = {"negative": [1, -1], "vocab": [_vocab(model)], "huge": [2**63],
           "float": [1.5], "bool": [True], "str": ["7"]}[bad]
    with pytest.raises(InvalidArgumentError, match="token 0|token 1"):
        orion.generate(model, ids, max_tokens=2)


@pytest.mark.parametrize("max_tokens", [math.nan, -1, 1.5, True, "3", None, math.inf])
def test_bad_max_tokens_is_refused(model, max_tokens):
    import orion

    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        orion.generate(model, [1], max_tokens=max_tokens)


@pytest.mark.parametrize("option,value", [
    ("temperature", math.nan), ("temperature", math.inf), ("temperature", -0.5),
    ("temperature", "0.8"), ("top_p", math.nan), ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -1), ("top_k", 2.5), ("repetition_penalty", math.nan),
    ("repetition_penalty", 0.0), ("seed", -1), ("seed", 1.5)])
def test_bad_sampling_options_are_refused(model, option, value):
    import orion

    with pytest.raises(InvalidArgumentError, match=option):
        orion.generate(model, [1], max_tokens=2, **{option: value})


def test_a_prompt_that_is_not_utf8_is_refused(model):
    import orion

    bad = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")   # how argv arrives
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        orion.generate(model, bad, max_tokens=2)


# ---- llama2.c version relabelled ---------------------------------------------------


def _llama2c(tmp_path: Path, version: int) -> Path:
    from models.llama_args import llama

    from orion.formats.llama2c import HEADER_BYTES, MAGIC, Shape, _shapes, write_llama2c
    from orion.models.weights import init_weights

    arch = llama(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64,
                 hidden_dim=64, max_seq_len=16)
    cfg = Shape.of_config(arch.to_config())
    path = tmp_path / f"v{version}.bin"
    if version in (0, 1):
        write_llama2c(path, arch.to_config(), init_weights(arch, 1), version=version)
        return path
    # version 2 (Q8_0), written here as llama2.c's export.py lays it out
    group = 32
    ints = [cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
            cfg.vocab_size, cfg.max_seq_len]
    head = struct.pack("<Ii7iBi", MAGIC, 2, *ints, 1, group)
    parts = [head + b"\0" * (HEADER_BYTES - len(head))]
    parts.append(np.ones((2 * cfg.n_layers + 1) * cfg.dim, np.float32).tobytes())
    mats = [cfg.vocab_size * cfg.dim] + [r * c for r, c in _shapes(cfg).values()] * 2
    for n in mats:
        parts.append(np.ones(n, np.int8).tobytes() + np.full(n // group, 0.01, np.float32)
                     .tobytes())
    path.write_bytes(b"".join(parts))
    return path


@pytest.mark.parametrize("src,dst", [(1, 2), (2, 1), (1, 3), (2, 7)])
def test_a_relabelled_llama2c_version_is_refused(tmp_path, src, dst):
    from orion.formats.llama2c import read_llama2c

    path = _llama2c(tmp_path, src)
    read_llama2c(path)   # whole as written
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 4, dst)
    if dst == 2:
        struct.pack_into("<i", data, 37, 32)   # a plausible group size too
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="relabelled|not supported|group"):
        read_llama2c(path)


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("delta", [-4, -1, 1, 64])
def test_a_llama2c_file_of_the_wrong_size_is_refused(tmp_path, version, delta):
    from orion.formats.llama2c import read_llama2c

    path = _llama2c(tmp_path, version)
    data = path.read_bytes()
    path.write_bytes(data[:delta] if delta < 0 else data + b"\0" * delta)
    with pytest.raises(ModelLoadError, match="bytes"):
        read_llama2c(path)


# ---- training configs ----------------------------------------------------------------

BAD_VALUES = {
    "lr": [math.nan, -1e-3, math.inf, "1e-3", None, True],
    "min_lr": [math.nan, -1.0],
    "grad_accum": [0, -1, 1.5, "2", None],
    "steps": [-1, 1.5, math.nan, None],
    "checkpoint_every": [-1, 2.5],
    "log_every": [0, -3],
    "batch_size": [0, -2, 2**40, 1.0],
    "seq_len": [0, -16, 2**40],
    "warmup": [-1, 0.5],
    "weight_decay": [math.nan, -0.1],
    "beta1": [1.0, -0.1, math.nan],
    "beta2": [1.0, 2.0],
    "grad_clip": [math.nan, -1.0],
    "loss_scale": [0.0, math.nan, math.inf, -1.0],
    "val_fraction": [1.0, -0.1, math.nan],
    "vocab_size": [0, 1, -5, 2**40, 512.0],
    "seed": [-1, 1.5],
    "export_dtype": ["int4", "bfloat16", None, 16],
    "update": ["sgd", 3],   # null is the default: inputs on ane, delta elsewhere
    "dynamic_loss_scale": [1, "yes"],
    "tokenizer": ["", 3, None],
    "blas_threads": [0, -1, 2.5],
    "model": [7, ["dim"], "stories1T"],
}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_bad_training_config_field_is_refused(data):
    from orion.train.config import TrainConfig

    field = data.draw(st.sampled_from(sorted(BAD_VALUES)))
    value = data.draw(st.sampled_from(BAD_VALUES[field]))
    raw = {**tiny_train_config().to_dict(), field: value}
    with pytest.raises(ConfigError, match=field if field != "model" else "model"):
        TrainConfig.from_dict(raw, "c.json")


@pytest.mark.parametrize("model", [
    {"dim": 32, "n_layers": 1, "n_heads": 0, "hidden_dim": 64},
    {"dim": "32", "n_layers": 1, "n_heads": 2, "hidden_dim": 64},
    {"dim": 32, "n_layers": None, "n_heads": 2, "hidden_dim": 64},
    {"dim": 32.0, "n_layers": 1, "n_heads": 2, "hidden_dim": 64},
    {"dim": 30, "n_layers": 1, "n_heads": 4, "hidden_dim": 64},
    {"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64, "norm_eps": math.nan},
    {"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64, "bogus": 1},
])
def test_bad_model_sections_are_config_errors(model):
    with pytest.raises(ConfigError, match="c.json: model"):
        from orion.train.config import TrainConfig

        TrainConfig.from_dict({**tiny_train_config().to_dict(), "model": model}, "c.json")


def test_a_valid_config_round_trips():
    from orion.train.config import TrainConfig

    raw = tiny_train_config().to_dict()
    assert TrainConfig.from_dict(json.loads(json.dumps(raw))).to_dict() == raw


# ---- checkpoints that do not match the run -------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 3-step run: (its folder, its corpus)."""
    from orion.train.trainer import Trainer

    base = tmp_path_factory.mktemp("run")
    data = small_corpus(base)
    tr = Trainer(tiny_train_config(steps=3, backend="vane"), data, base / "out",
                 progress=False)
    try:
        tr.fit()
    finally:
        tr.close()
    return base / "out", data


def _copy_run(run, tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    out, data = run
    shutil.copytree(out, tmp_path / "out")
    shutil.copyfile(data, tmp_path / "corpus.txt")
    return tmp_path / "out", tmp_path / "corpus.txt"


def _resume(out: Path, data: Path, **config):
    from orion.train.trainer import Trainer

    tr = Trainer(tiny_train_config(steps=6, backend="vane", **config), data, out,
                 resume=True, progress=False)
    tr.close()


def test_the_unchanged_run_resumes(run, tmp_path):
    _resume(*_copy_run(run, tmp_path))


def test_a_changed_model_config_is_refused_naming_the_field(run, tmp_path):
    from orion.train.checkpoint import CheckpointError

    out, data = _copy_run(run, tmp_path)
    with pytest.raises(CheckpointError, match="hidden_dim 64 -> 96"):
        _resume(out, data, model={"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 96})


def test_changed_data_is_refused(run, tmp_path):
    from orion.train.checkpoint import CheckpointError

    out, data = _copy_run(run, tmp_path)
    text = data.read_text()
    data.write_text(text[: len(text) // 2] + "An added line.\n" + text[len(text) // 2:])
    with pytest.raises(CheckpointError, match="training data changed"):
        _resume(out, data)


def test_a_swapped_tokenizer_of_the_same_size_is_refused(run, tmp_path):
    from orion.tokenizers.sentencepiece import SentencePieceTokenizer, train_sentencepiece
    from orion.train.checkpoint import CheckpointError

    out, data = _copy_run(run, tmp_path)
    other_text = tmp_path / "other.txt"
    other_text.write_text(data.read_text()[::-1])   # a different corpus, same characters
    train_sentencepiece(other_text, 384, tmp_path / "other.model")
    assert SentencePieceTokenizer(tmp_path / "other.model").vocab_size == 384
    (out / "tokenizer.model").write_bytes((tmp_path / "other.model").read_bytes())
    with pytest.raises(CheckpointError, match="tokenizer changed"):
        _resume(out, data)


def _rewrite_tensor(path: Path, mutate, keep_checksum: bool) -> None:
    """Changes one tensor of a checkpoint; with keep_checksum the metadata's checksum is
    recomputed, so only the content check can notice."""
    from safetensors.numpy import save_file

    from orion.train.checkpoint import load_checkpoint, tensors_sha256

    ck = load_checkpoint(path)
    tensors = {**ck.weights, **ck.optim}
    name = sorted(ck.weights)[0]
    tensors[name] = mutate(tensors[name].copy())
    meta = dict(ck.meta)
    if keep_checksum:
        meta["tensors_sha256"] = tensors_sha256(tensors)
    save_file(tensors, str(path), metadata={"orion": json.dumps(meta)})


@pytest.mark.parametrize("damage", ["bitflip-bytes", "bitflip-tensor", "nan", "inf", "truncate",
                                    "empty", "no-metadata"])
def test_a_corrupt_checkpoint_is_refused_and_kept(run, tmp_path, damage):
    from safetensors.numpy import save_file

    from orion.train.checkpoint import CHECKPOINT, CheckpointError

    out, data = _copy_run(run, tmp_path)
    path = out / CHECKPOINT
    raw = bytearray(path.read_bytes())
    if damage == "bitflip-bytes":
        raw[len(raw) - 100] ^= 0x10            # inside the last tensor's data
        path.write_bytes(bytes(raw))
    elif damage == "bitflip-tensor":
        def flip(t):
            t.view(np.uint32).reshape(-1)[0] ^= 1 << 3
            return t
        _rewrite_tensor(path, flip, keep_checksum=False)
    elif damage in ("nan", "inf"):
        def poison(t):
            t.reshape(-1)[0] = np.nan if damage == "nan" else np.inf
            return t
        _rewrite_tensor(path, poison, keep_checksum=True)
    elif damage == "truncate":
        path.write_bytes(bytes(raw[: len(raw) // 2]))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        save_file({"w": np.zeros(2, np.float32)}, str(path))
    before = path.read_bytes()
    with pytest.raises(CheckpointError):
        _resume(out, data)
    assert path.read_bytes() == before   # refused, never overwritten
