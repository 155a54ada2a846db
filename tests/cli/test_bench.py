"""`orion bench`: llama-bench's tests (ppN, tgN) and a training step, a table or JSON on
stdout, progress on stderr as it runs; refusals are one line and exit 2."""

from __future__ import annotations

import json
import re

import pytest
from models.conftest import TINY, save_peaked_gpt2

from orion.cli import main

pytestmark = pytest.mark.native
ROW = re.compile(r"^\| shakespeare-llama +\| +2\.2M \| vane +\| +\d+ \| (\w+) +\| +"
                 r"([\d,]+\.\d\d) ± ([\d,]+\.\d\d) \|$")


@pytest.mark.slow
def test_table_and_progress_on_the_shipped_model(capsys):
    assert main(["bench", "-p", "32,64", "-n", "16", "-t", "32", "-r", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "model", "params", "backend", "threads", "test", "t/s"]
    rows = [ROW.match(line) for line in lines[2:]]
    assert all(rows), out
    assert [r.group(1) for r in rows] == ["pp32", "pp64", "tg16", "train32"]
    assert all(float(r.group(2).replace(",", "")) > 0 for r in rows)
    # what it runs and how far along, as it goes
    for test in ("pp32", "pp64", "tg16", "train32"):
        assert f"{test}: warm-up" in err and f"{test}: run 2/2: " in err
    assert err.splitlines()[-1].endswith("done")


@pytest.mark.slow
def test_json_has_llama_benchs_fields(capsys):
    assert main(["bench", "-p", "32", "-n", "8", "-t", "0", "-r", "3", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp32", "tg8"]
    for r in rows:
        assert {"model", "params", "backend", "n_threads", "n_prompt", "n_gen", "avg_ns",
                "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts"} <= set(r)
        assert len(r["samples_ns"]) == 3
        tokens = r["n_prompt"] or r["n_gen"]
        assert r["samples_ts"] == pytest.approx([tokens * 1e9 / ns for ns in r["samples_ns"]])
    assert rows[0]["n_prompt"] == 32 and rows[1]["n_gen"] == 8


@pytest.mark.slow
def test_a_model_orion_train_cannot_train(tmp_path, capsys):
    folder = save_peaked_gpt2(tmp_path / "gpt2", TINY)
    capsys.readouterr()
    assert main(["bench", "-m", str(folder), "-p", "32", "-n", "4", "-r", "1"]) == 0
    out, err = capsys.readouterr()
    assert "| pp32 " in out and "train" not in out      # the default: a note, no row
    assert "no training step: orion train needs a SentencePiece tokenizer.model" in err
    assert main(["bench", "-m", str(folder), "-p", "0", "-n", "0", "-t", "32"]) == 2
    assert "-t: cannot bench a training step: orion train needs a SentencePiece" in \
        capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["-p", "1000", "-n", "0", "-t", "0"], "-p 1000: a prompt must be 1 to 256 tokens"),
    (["-p", "0", "-n", "256", "-t", "0"], "-n 256: generation must be 1 to 255 tokens"),
    (["-p", "0", "-n", "0", "-t", "300"], "-t 300: a training sequence must be 1 to 256"),
    (["-r", "0"], "-r 0: give at least 1 repetition"),
    (["-p", "-4"], "-p -4: token counts must be >= 0"),
    (["-p", "many"], "'many': give token counts separated by commas"),
])
def test_refusals_are_one_line(capsys, args, message):
    try:
        code = main(["bench", "-r", "1", *args])
    except SystemExit as exit_:   # argparse's own usage errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert [line for line in err.splitlines() if "error" in line] == [err.splitlines()[-1]]
