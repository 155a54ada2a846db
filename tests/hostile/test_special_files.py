"""Class 1: every file Orion reads is a regular file of bounded size, checked on the
descriptor before a byte is read. A FIFO must be refused at once (not block), a
device must not be read to exhaustion. HangWatch turns a hang into a failure."""

from __future__ import annotations

import os

import pytest

from hostile.helpers import copy_folder, fifo_at, small_corpus, tiny_train_config
from orion.errors import OrionError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"),
                                reason="needs POSIX FIFOs; runs on Linux and macOS")


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "vocab.json",
                                  "merges.txt", "tokenizer.json"])
def test_fifo_in_a_gpt2_folder_is_refused(tmp_path, gpt2_dir, name):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    if name in ("vocab.json", "merges.txt"):   # both must exist for the pair to be read
        other = "merges.txt" if name == "vocab.json" else "vocab.json"
        (folder / other).write_text("{}" if other == "vocab.json" else "#version: 0.2\n")
    with fifo_at(folder / name), pytest.raises(OrionError, match="not a regular file"):
        orion.load(folder)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_a_device_linked_as_a_model_file_is_refused(tmp_path, gpt2_dir, target):
    import orion

    if not os.path.exists(target):
        pytest.skip(f"no {target} here; runs on Linux and macOS")
    folder = copy_folder(gpt2_dir, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    # a link out of the folder is refused by the folder rule; inside, by the kind check
    (folder / "model.safetensors").symlink_to(target)
    with pytest.raises(OrionError):
        orion.load(folder)


def test_fifo_or_device_as_a_sentencepiece_model(tmp_path):
    from orion.errors import ModelLoadError
    from orion.tokenizers.sentencepiece import SentencePieceTokenizer

    with fifo_at(tmp_path / "tokenizer.model"), pytest.raises(ModelLoadError,
                                                              match="not a regular file"):
        SentencePieceTokenizer(tmp_path / "tokenizer.model")
    (tmp_path / "zero.model").symlink_to("/dev/zero")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        SentencePieceTokenizer(tmp_path / "zero.model")


def test_fifo_as_a_llama2c_checkpoint_and_its_tokenizer(tmp_path):
    from orion.errors import ModelLoadError
    from orion.formats.llama2c import read_llama2c, read_tokenizer_bin

    with fifo_at(tmp_path / "m.bin"), pytest.raises(ModelLoadError, match="not a regular"):
        read_llama2c(tmp_path / "m.bin")
    with fifo_at(tmp_path / "tok.bin"), pytest.raises(ModelLoadError, match="not a regular"):
        read_tokenizer_bin(tmp_path / "tok.bin", 10)


def test_fifo_to_the_c_blob_reader(tmp_path):
    """orion_blob_open opened before it checked: a FIFO blocked it in open()."""
    from orion.errors import IOFailure
    from orion.runtime.blob import read_blob

    with fifo_at(tmp_path / "w.bin"), pytest.raises(IOFailure, match="not a regular file"):
        read_blob(tmp_path / "w.bin")
    with pytest.raises(IOFailure, match="not a regular file"):
        read_blob("/dev/zero")


def test_fifo_as_program_weights_given_by_path(tmp_path):
    from orion.files import UnsafeFileError
    from orion.runtime import Program

    with fifo_at(tmp_path / "w.bin"), pytest.raises(UnsafeFileError, match="not a regular"):
        Program.compile("program(1.3)\n", {"@model_path/weights/w.bin": tmp_path / "w.bin"})


@pytest.mark.parametrize("what", ["data", "config", "tokenizer", "checkpoint"])
def test_fifo_in_training_inputs(tmp_path, what):
    from orion.train.checkpoint import CHECKPOINT
    from orion.train.config import TrainConfig
    from orion.train.trainer import Trainer

    data = small_corpus(tmp_path)
    out = tmp_path / "run"
    if what == "data":
        with fifo_at(tmp_path / "fifo.txt"), pytest.raises(OrionError, match="not a regular"):
            Trainer(tiny_train_config(), tmp_path / "fifo.txt", out, progress=False)
    elif what == "config":
        with fifo_at(tmp_path / "c.json"), pytest.raises(OrionError, match="not a regular"):
            TrainConfig.from_file(tmp_path / "c.json")
    elif what == "tokenizer":
        with fifo_at(tmp_path / "t.model"), pytest.raises(OrionError, match="not a regular"):
            Trainer(tiny_train_config(tokenizer=str(tmp_path / "t.model")), data, out,
                    progress=False)
    else:
        out.mkdir()
        with fifo_at(out / CHECKPOINT), pytest.raises(OrionError, match="not a regular"):
            Trainer(tiny_train_config(), data, out, resume=True, progress=False)
    assert what == "checkpoint" or not out.exists()   # a failed run leaves no folder


def test_oversized_file_is_refused_before_reading(tmp_path):
    from orion.files import UnsafeFileError, read_bytes

    big = tmp_path / "big"
    with open(big, "wb") as f:   # sparse: 1 GiB of size, no disk
        f.truncate(1 << 30)
    with pytest.raises(UnsafeFileError, match="more than"):
        read_bytes(big, max_bytes=1 << 20)


def test_a_link_planted_at_a_temp_name_is_never_written_through(tmp_path):
    """Writers replace files through a temp file named after the pid; a link planted
    there (or a FIFO) must not redirect the write."""
    import numpy as np

    from orion.atomic import atomic_write_bytes
    from orion.runtime.blob import write_blob

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / f".out.bin.tmp-{os.getpid()}").symlink_to(victim)
    atomic_write_bytes(tmp_path / "out.bin", b"new")
    (tmp_path / f"w.blob.{os.getpid()}.orion-tmp").symlink_to(victim)
    write_blob(tmp_path / "w.blob", {"w": np.zeros(4, np.float16)})
    assert victim.read_text() == "keep"
    assert (tmp_path / "out.bin").read_bytes() == b"new" and (tmp_path / "w.blob").is_file()
