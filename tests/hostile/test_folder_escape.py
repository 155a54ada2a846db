"""Class 2: every file a folder names resolves inside that folder (symlinks followed),
and an error about a file never quotes its contents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile.helpers import copy_folder
from orion.errors import ModelLoadError, OrionError

SECRET = "root:x:0:0:secret-line-that-must-not-leak:/root:/bin/bash"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file outside every model folder, holding a line that must never be echoed."""
    path = tmp_path / "outside" / "passwd"
    path.parent.mkdir()
    path.write_text(SECRET + "\n" + SECRET + "\n")
    return path


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "vocab.json",
                                  "merges.txt", "encoder.json", "vocab.bpe", "tokenizer.json"])
def test_a_link_out_of_the_folder_is_refused(tmp_path, gpt2_dir, outside, name):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    pair = {"vocab.json": "merges.txt", "merges.txt": "vocab.json",
            "encoder.json": "vocab.bpe", "vocab.bpe": "encoder.json"}
    if name in pair:
        (folder / pair[name]).symlink_to(outside)   # the pair's other half, also out
    target = folder / name
    if target.exists():
        target.unlink()
    target.symlink_to(outside)
    with pytest.raises(OrionError, match="outside") as err:
        orion.load(folder)
    assert "secret-line" not in str(err.value)


def test_a_link_that_climbs_with_dotdot_is_refused(tmp_path, gpt2_dir, outside):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    (folder / "merges.txt").symlink_to(Path("..") / "outside" / "passwd")
    (folder / "vocab.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="outside"):
        orion.load(folder)


def test_a_link_inside_the_folder_is_fine(tmp_path, gpt2_dir):
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    (folder / "weights").mkdir()
    (folder / "model.safetensors").rename(folder / "weights" / "real.safetensors")
    (folder / "model.safetensors").symlink_to(Path("weights") / "real.safetensors")
    model, _ = orion.load(folder)
    model.close()


@pytest.mark.parametrize("name,other", [("merges.txt", "vocab.json"),
                                        ("vocab.json", "merges.txt")])
def test_a_file_that_is_not_what_it_claims_is_never_quoted(tmp_path, gpt2_dir, outside, name,
                                                           other):
    """The probe's case: a merges file holding /etc/passwd (here, a copy inside the
    folder) echoed its first line into the error."""
    import orion

    folder = copy_folder(gpt2_dir, tmp_path / "m")
    shutil.copyfile(outside, folder / name)
    (folder / other).write_text("{}" if other == "vocab.json" else "#version: 0.2\n")
    with pytest.raises(ModelLoadError) as err:
        orion.load(folder)
    assert "secret-line" not in str(err.value)


WORD = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc", "Zl", "Zp")),
               min_size=4, max_size=12)
LINE = st.lists(WORD, min_size=2, max_size=4).map(" ".join)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, min_size=1, max_size=5))
def test_no_error_about_a_tokenizer_file_quotes_it(tmp_path_factory, lines):
    """Whatever text stands in merges.txt, vocab.json, vocab.bpe or a ranks file, the
    error names the file (and a line number), never a line of it."""
    from orion.tokenizers.gpt2 import GPT2Tokenizer, read_tiktoken_ranks

    folder = tmp_path_factory.mktemp("tok")
    body = "\n".join(lines) + "\n"
    (folder / "vocab.json").write_text(json.dumps({ln: i for i, ln in enumerate(lines)}))
    (folder / "merges.txt").write_text(body)
    (folder / "ranks.tiktoken").write_text(body)
    for call in (lambda: GPT2Tokenizer.from_folder(folder),
                 lambda: read_tiktoken_ranks(folder / "ranks.tiktoken")):
        try:
            call()
        except ModelLoadError as exc:
            text = str(exc)
            assert not any(ln in text for ln in lines), text


def test_llama2c_tokenizer_and_sentencepiece_errors_quote_nothing(tmp_path, outside):
    from orion.formats.llama2c import read_llama2c
    from orion.tokenizers.sentencepiece import SentencePieceTokenizer

    shutil.copyfile(outside, tmp_path / "tokenizer.model")
    with pytest.raises(ModelLoadError) as err:
        SentencePieceTokenizer(tmp_path / "tokenizer.model")
    assert "secret-line" not in str(err.value)
    shutil.copyfile(outside, tmp_path / "m.bin")
    with pytest.raises(ModelLoadError) as err:
        read_llama2c(tmp_path / "m.bin")
    assert "secret-line" not in str(err.value)


def test_a_llama2c_bin_linked_from_outside_the_folder_is_refused(tmp_path, outside):
    import orion

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.bin").symlink_to(outside)
    with pytest.raises(ModelLoadError, match="outside"):
        orion.load(tmp_path / "m")


@pytest.mark.parametrize("name", ["checkpoint.safetensors", "tokenizer.model"])
def test_run_folder_files_linked_out_are_refused(tmp_path, outside, name):
    from hostile.helpers import small_corpus, tiny_train_config
    from orion.train.checkpoint import CheckpointError
    from orion.train.trainer import Trainer

    data = small_corpus(tmp_path)
    out = tmp_path / "run"
    tr = Trainer(tiny_train_config(steps=1, backend="vane"), data, out, progress=False)
    try:
        tr.fit()
    finally:
        tr.close()
    (out / name).unlink()
    (out / name).symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside"):
        Trainer(tiny_train_config(steps=2, backend="vane"), data, out, resume=True,
                progress=False)
    assert (out / name).is_symlink()   # refused, not replaced
