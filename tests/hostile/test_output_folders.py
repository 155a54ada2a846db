"""Class 14: output folders. `orion lora --adapter-path DIR` overwrote an existing
adapter and its log.jsonl without --overwrite (tried as a new user would, a 30-step
adapter was replaced by a 1-step one), and `orion fuse --out DIR` replaced the
config.json of any folder. Both now follow `orion train`'s rule: a folder that holds a
run, an adapter or a model is refused unless --overwrite (or --resume for lora),
--overwrite replaces only the command's own files, and a run that fails removes the
folders it created (issue 34: it left them behind empty)."""

from __future__ import annotations

import json

import pytest

from hostile.helpers import (
    assert_one_line_error,
    peft_config,
    run_cli,
    shipped_model,
    write_adapter,
)


def _data(folder, lines=('{"text": "ROMEO: what light through yonder window breaks"}',)):
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid"):
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _lora(tmp_path, out, *extra):
    return ["lora", "--data", str(_data(tmp_path / "data")), "--adapter-path", str(out),
            "--iters", "1", "--batch-size", "1", "--val-batches", "1", "--max-seq-length",
            "32", "--rank", "2", "--save-every", "0", "--no-progress", *extra]


@pytest.fixture
def old_adapter(tmp_path):
    """An adapter folder as a finished `orion lora` leaves it, and a file of the user's."""
    out = write_adapter(tmp_path / "ad", peft_config(r=2))
    (out / "log.jsonl").write_text('{"step": 30, "loss": 1.0}\n')
    (out / "notes.txt").write_text("mine")
    return out


def test_lora_refuses_a_folder_holding_an_adapter(tmp_path, capsys, old_adapter):
    before = _snapshot(old_adapter)
    rc, _, err = run_cli(_lora(tmp_path, old_adapter), capsys)
    line = assert_one_line_error(rc, err, "lora")
    assert "--overwrite" in line and "--resume" in line
    assert _snapshot(old_adapter) == before


def test_lora_refuses_a_model_folder(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rc, _, err = run_cli(_lora(tmp_path, model), capsys)
    assert_one_line_error(rc, err, "lora")
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_lora_overwrite_replaces_only_its_own_files(tmp_path, capsys, old_adapter):
    rc, out, err = run_cli(_lora(tmp_path, old_adapter, "--overwrite"), capsys)
    assert rc == 0, err
    assert (old_adapter / "notes.txt").read_text() == "mine"
    log = (old_adapter / "log.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in log] == [0, 1]
    assert json.loads((old_adapter / "adapter_config.json").read_text())["r"] == 2


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys, old_adapter):
    rc, _, err = run_cli(_lora(tmp_path, old_adapter, "--resume", "--overwrite"), capsys)
    assert_one_line_error(rc, err, "lora")


@pytest.mark.parametrize("failure", ["nothing to resume", "no such backend", "no data",
                                     "bad data", "bad model"])
def test_a_failed_lora_run_leaves_no_folder_it_created(tmp_path, capsys, failure):
    """The first two failed after the folders were made, and left them behind."""
    argv = _lora(tmp_path, tmp_path / "a" / "b" / "c")
    if failure == "nothing to resume":
        argv.append("--resume")
    elif failure == "no such backend":
        argv += ["--backend", "tpu"]
    elif failure == "no data":
        argv[argv.index("--data") + 1] = str(tmp_path / "nowhere")
    elif failure == "bad data":
        _data(tmp_path / "data", lines=('{"text": ' + "1" * 5000 + "}",))
    else:
        argv += ["--model", str(tmp_path / "nowhere")]
    rc, _, err = run_cli(argv, capsys)
    assert_one_line_error(rc, err, "lora")
    assert not (tmp_path / "a").exists()


# ---- orion fuse --------------------------------------------------------------------------

def _fuse(tmp_path, out, *extra):
    ad = tmp_path / "ad"
    if not ad.exists():
        write_adapter(ad)
    return ["fuse", "--adapter-path", str(ad), "--out", str(out), *extra]


def test_fuse_refuses_a_folder_with_a_config(tmp_path, capsys):
    out = tmp_path / "somewhere"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    rc, _, err = run_cli(_fuse(tmp_path, out), capsys)
    assert "--overwrite" in assert_one_line_error(rc, err, "fuse")
    assert _snapshot(out) == {"config.json": b'{"mine": true}'}


def test_fuse_overwrite_replaces_its_own_output(tmp_path, capsys):
    out = tmp_path / "fused"
    assert run_cli(_fuse(tmp_path, out), capsys)[0] == 0
    (out / "notes.txt").write_text("mine")
    rc, _, err = run_cli(_fuse(tmp_path, out), capsys)
    assert_one_line_error(rc, err, "fuse")
    assert run_cli(_fuse(tmp_path, out, "--overwrite"), capsys)[0] == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.model", "notes.txt"} <= names


@pytest.mark.parametrize("stale", ["model-00001-of-00002.safetensors", "tokenizer.json",
                                   "pytorch_model.bin", "adapter_config.json"])
def test_fuse_overwrite_refuses_model_files_it_would_leave(tmp_path, capsys, stale):
    """A stale shard or tokenizer beside the fused weights would load with them."""
    out = tmp_path / "fused"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / stale).write_text("old")
    before = _snapshot(out)
    rc, _, err = run_cli(_fuse(tmp_path, out, "--overwrite"), capsys)
    assert stale in assert_one_line_error(rc, err, "fuse")
    assert _snapshot(out) == before


def test_a_failed_fuse_leaves_no_folder_it_created(tmp_path, capsys):
    """A = B = 300 in the float16 shipped model: refused when loaded, or by the writer
    once merged; either way nothing stays."""
    write_adapter(tmp_path / "ad", tensors={
        name: arr * 0 + 300 for name, arr in __import__("hostile.helpers", fromlist=["x"])
        .adapter_tensors().items()})
    rc, _, err = run_cli(_fuse(tmp_path, tmp_path / "x" / "y"), capsys)
    assert_one_line_error(rc, err, "fuse")
    assert not (tmp_path / "x").exists()
    assert shipped_model().is_dir()
