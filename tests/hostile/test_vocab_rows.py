"""Class 12: the sampler and the vocabulary. Real models have embedding rows no token
uses (Qwen2.5: 151,936 rows, 151,665 ids); such an id is never sampled. A SentencePiece
tokenizer or a tokenizer.json smaller than the model used to load and then die
mid-stream with a raw IndexError ("piece id is out of range", "token id 1999 is not in
the vocabulary"). repetition_penalty=1e-320 with sampling failed inside numpy
("probabilities contain NaN"), and stop=[None] was accepted."""

from __future__ import annotations

import json

import numpy as np
import pytest

import orion
from hostile.helpers import (
    gpt2_with_big_rows,
    shipped_model,
    shipped_with_rows,
    write_tokenizer_json,
)
from orion.errors import OrionError


def _tokens(model, prompt, **options):
    return [r.token for r in orion.stream_generate(model, prompt, **options)
            if r.token is not None]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.5, "seed": 0}])
def test_sentencepiece_smaller_than_the_model_never_samples_past_it(tmp_path, sampling):
    model, tok = orion.load(shipped_with_rows(tmp_path / "m", rows=52))
    try:
        assert model.prefill(tok.encode("ROMEO:")).argmax() >= tok.vocab_size  # would pick
        ids = _tokens(model, "ROMEO:", max_tokens=12, **sampling)
        assert ids and max(ids) < tok.vocab_size
        assert isinstance(orion.generate(model, "JULIET:", max_tokens=6, **sampling), str)
    finally:
        model.close()


@pytest.mark.slow
def test_tokenizer_json_smaller_than_the_model_never_samples_past_it(tmp_path):
    folder = write_tokenizer_json(gpt2_with_big_rows(tmp_path / "m", first_big=260))
    model, tok = orion.load(folder)
    try:
        assert tok.vocab_size == 260 < model.config.vocab_size
        assert model.prefill(tok.encode("hello the")).argmax() >= tok.vocab_size
        ids = _tokens(model, "hello the", max_tokens=12)
        assert ids and max(ids) < tok.vocab_size
    finally:
        model.close()


def _fewer_rows(folder, rows: int) -> None:
    """Cuts a folder's embedding (and tied head) to its first `rows` rows."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    name = next(k for k in tensors if k.endswith(("embed_tokens.weight", "wte.weight")))
    tensors[name] = tensors[name][:rows].copy()
    save_file(tensors, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "vocab_size": rows}))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_tokenizer_with_more_ids_than_the_model_is_refused_at_load(tmp_path, arch):
    import shutil

    from hostile.helpers import write_gpt2_folder

    folder = tmp_path / "m"
    if arch == "llama":
        shutil.copytree(shipped_model(), folder)
    else:
        write_tokenizer_json(write_gpt2_folder(folder))
    _fewer_rows(folder, 200)
    with pytest.raises(OrionError, match="tokenizer"):
        model, _ = orion.load(folder)
        model.close()


@pytest.fixture(scope="module")
def shipped():
    model, _ = orion.load()
    yield model
    model.close()


@pytest.mark.slow
@pytest.mark.parametrize("penalty", [1e-320, 1e-300, 5e-324])
def test_a_tiny_repetition_penalty_with_sampling_still_samples(shipped, penalty):
    text = orion.generate(shipped, "ROMEO:", max_tokens=8, temperature=0.8, seed=0,
                          repetition_penalty=penalty)
    assert isinstance(text, str)


def test_a_tiny_temperature_samples_the_most_likely_token(shipped):
    greedy = _tokens(shipped, "ROMEO:", max_tokens=6)
    tiny = _tokens(shipped, "ROMEO:", max_tokens=6, temperature=1e-300, seed=1)
    assert tiny == greedy


@pytest.mark.parametrize("stop", [[None], [1], b"x", [["a"]], 5])
def test_stop_must_be_strings(shipped, stop):
    with pytest.raises(OrionError, match="stop"):
        orion.generate(shipped, "ROMEO:", max_tokens=2, stop=stop)


def test_logits_with_nothing_finite_are_an_error_not_a_token():
    from orion.sample import Sampler, SamplingOptions

    for options in (SamplingOptions(), SamplingOptions(temperature=0.7, seed=0)):
        with pytest.raises(OrionError, match="finite"):
            Sampler(options)(np.full(16, np.nan, np.float32))
        assert Sampler(options)(np.array([np.nan, np.inf, 0.0, 1.0])) == 1
