"""Class 6 at the command line: a table of bad invocations of `orion generate` and
`orion train`; each must end in exactly one stderr line `orion <command>: error: ...`,
exit status 2, and no traceback (which only --debug shows)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostile.helpers import small_corpus, tiny_train_config
from orion.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The files the table's invocations name."""
    base = tmp_path_factory.mktemp("cli")
    data = small_corpus(base)
    good = base / "good.json"
    good.write_text(json.dumps(tiny_train_config(steps=2, backend="vane").to_dict()))
    run = base / "run"   # a finished run, for "exists without --resume"
    assert main(["train", "--config", str(good), "--data", str(data), "--out", str(run),
                 "--no-progress"]) == 0
    bad_model = base / "badmodel"
    bad_model.mkdir()
    (bad_model / "config.json").write_text('{"model_type": "gpt2", "n_head": 0}')
    (base / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    (base / "nan.json").write_text(json.dumps({**tiny_train_config().to_dict(), "lr": "nan"})
                                   .replace('"nan"', "NaN"))
    (base / "int4.json").write_text(json.dumps({**tiny_train_config().to_dict(),
                                                "export_dtype": "int4"}))
    (base / "empty.txt").write_text("")
    (base / "a-file").write_text("x")
    os.mkfifo(base / "fifo.json")
    return {"base": base, "data": data, "good": good, "run": run, "bad_model": bad_model}


def _table(f: dict[str, Path]) -> dict[str, list[str]]:
    b, data, good = str(f["base"]), str(f["data"]), str(f["good"])
    fresh = str(f["base"] / "fresh")
    return {
        "generate: no such model": ["generate", "--model", f"{b}/nowhere", "hi"],
        "generate: n_head 0": ["generate", "--model", str(f["bad_model"]), "hi"],
        "generate: model is a file": ["generate", "--model", f"{b}/a-file", "hi"],
        "generate: max-tokens not a number": ["generate", "--max-tokens", "abc", "hi"],
        "generate: negative max-tokens": ["generate", "--max-tokens", "-5", "hi"],
        "generate: NaN temperature": ["generate", "--temperature", "nan", "hi"],
        "generate: NaN top-p": ["generate", "--top-p", "nan", "hi"],
        "generate: top-k negative": ["generate", "--top-k", "-3", "hi"],
        "generate: prompt not UTF-8": ["generate", "--max-tokens", "1",
                                       b"\xff\xfe".decode("utf-8", "surrogateescape")],
        "generate: unknown backend": ["generate", "--backend", "tpu", "hi"],
        "train: no config file": ["train", "--config", f"{b}/none.json", "--data", data,
                                  "--out", fresh],
        "train: config is a FIFO": ["train", "--config", f"{b}/fifo.json", "--data", data,
                                    "--out", fresh],
        "train: deep config": ["train", "--config", f"{b}/deep.json", "--data", data,
                               "--out", fresh],
        "train: NaN lr": ["train", "--config", f"{b}/nan.json", "--data", data, "--out", fresh],
        "train: export int4": ["train", "--config", f"{b}/int4.json", "--data", data,
                               "--out", fresh],
        "train: no data": ["train", "--config", good, "--data", f"{b}/none.txt",
                           "--out", fresh],
        "train: empty data": ["train", "--config", good, "--data", f"{b}/empty.txt",
                              "--out", fresh],
        "train: resume without checkpoint": ["train", "--config", good, "--data", data,
                                             "--out", fresh, "--resume"],
        "train: existing run": ["train", "--config", good, "--data", data,
                                "--out", str(f["run"])],
        "train: out is a file": ["train", "--config", good, "--data", data,
                                 "--out", f"{b}/a-file"],
        "train: negative steps": ["train", "--config", good, "--data", data, "--out", fresh,
                                  "--steps", "-1"],
        "train: missing arguments": ["train", "--config", good],
        "unknown command": ["bogus"],
        "unknown option": ["generate", "--bogus", "hi"],
    }


CASES = list(_table({k: Path("/") for k in ("base", "data", "good", "run", "bad_model")}))


@pytest.mark.parametrize("case", CASES)
def test_bad_invocation_is_one_line_exit_2(files, case, capsys):
    argv = _table(files)[case]
    try:
        rc = main(argv)
    except SystemExit as exc:   # argparse's usage errors exit from inside parse_args
        rc = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (case, rc, err)
    assert len(lines) == 1, (case, err)
    assert lines[0].startswith(("orion generate: error: ", "orion train: error: ",
                                "orion: error: ")), lines[0]
    assert "Traceback" not in err
    assert not (files["base"] / "fresh").exists(), "a failed run left its --out behind"


def test_disk_full_during_training_is_one_line(files, tmp_path, capsys, monkeypatch):
    import orion.train.trainer as trainer

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "checkpoint"))

    monkeypatch.setattr(trainer, "save_checkpoint", full)
    rc = main(["train", "--config", str(files["good"]), "--data", str(files["data"]),
               "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "No space left on device" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_debug_shows_the_traceback(files, capsys):
    rc = main(["--debug", "generate", "--model", str(files["bad_model"]), "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" in err and "orion generate: error:" in err
    rc = main(["generate", "--debug", "--model", str(files["bad_model"]), "hi"])
    assert rc == 2 and "Traceback" in capsys.readouterr().err


def test_ctrl_c_is_130(monkeypatch, capsys):
    import orion

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(orion, "load", interrupted)
    assert main(["generate", "hi"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_an_unexpected_exception_is_still_one_line(monkeypatch, capsys):
    import orion

    def broken(*a, **k):
        return {}["missing"]

    monkeypatch.setattr(orion, "load", broken)
    assert main(["generate", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KeyError" in err and "Traceback" not in err


def test_generate_into_a_closed_pipe_is_quiet(tmp_path):
    """`orion generate ... | head -1`: the reader leaves; no BrokenPipeError text."""
    import orion

    # cwd elsewhere: `-m` puts the cwd first on sys.path, and a source checkout
    # there (without a build) would shadow the installed orion this test imported
    env = dict(os.environ, PYTHONPATH=str(Path(orion.__file__).parents[1]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orion.cli", "generate", "ROMEO:", "--max-tokens", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()   # what head does after its line
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc in (0, 141), (rc, err)
