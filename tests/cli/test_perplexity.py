"""`orion perplexity`: the library's figure (tests/test_perplexity.py checks it against
transformers) on a text file, one line on stdout; refusals are one line and exit 2."""

from __future__ import annotations

import re

import pytest
from asset_paths import require_asset

import orion
from orion.cli import main
from orion.perplexity import perplexity

pytestmark = pytest.mark.native
LINE = re.compile(r"^perplexity (\d+\.\d{4}) \+/- (\d+\.\d{4}) \(mean NLL \d+\.\d{4} nats over "
                  r"([\d,]+) tokens; (\d+) windows? of (\d+) tokens, stride (\d+)\)\n$")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    text = require_asset("text/tinyshakespeare_input.txt").read_text(encoding="utf-8")
    path.write_text(text[:3000], encoding="utf-8")
    return path


@pytest.mark.slow
def test_prints_the_librarys_figure(corpus, capsys):
    assert main(["perplexity", str(corpus), "--context", "128", "--stride", "64",
                 "--no-progress"]) == 0
    got = LINE.match(capsys.readouterr().out)
    assert got, "one summary line"
    model, tokenizer = orion.load()
    try:
        ids = tokenizer.encode(corpus.read_text(encoding="utf-8"))
        expected = perplexity(model, ids, context=128, stride=64)
    finally:
        model.close()
    assert float(got.group(1)) == pytest.approx(expected.perplexity, abs=1e-4)
    assert int(got.group(3).replace(",", "")) == expected.tokens == len(ids) - 1
    assert got.group(5, 6) == ("128", "64")


@pytest.mark.slow
def test_defaults_and_max_tokens(corpus, capsys):
    assert main(["perplexity", str(corpus), "--max-tokens", "300", "--no-progress"]) == 0
    got = LINE.match(capsys.readouterr().out)
    assert got.group(3) == "299"                          # the first 300 tokens
    assert got.group(5, 6) == ("256", "128")              # the shipped model's context


@pytest.mark.slow
def test_an_adapter_changes_the_figure(corpus, tmp_path, capsys):
    from peft_adapters import peft_adapter

    from orion.models.registry import default_model_path

    adapter = peft_adapter(default_model_path(), tmp_path / "adapter", seed=1)
    figures = []
    for extra in ([], ["--adapter-path", str(adapter)]):
        assert main(["perplexity", str(corpus), "--max-tokens", "200", "--no-progress",
                     *extra]) == 0
        figures.append(LINE.match(capsys.readouterr().out).group(1))
    assert figures[0] != figures[1]


@pytest.mark.parametrize("args, message", [
    (["absent.txt"], "absent.txt: no such file"),
    (["{corpus}", "--context", "1000"], "the window must be 2 to 256 tokens"),
    (["{corpus}", "--stride", "0"], "the stride must be in [1, context 256]"),
    (["{corpus}", "--max-tokens", "1"], "at least 2 tokens"),
])
def test_refusals_are_one_line(corpus, tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["perplexity", *(a.format(corpus=corpus) for a in args),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orion perplexity: error: ") and message in err
    assert err.count("\n") == 1
