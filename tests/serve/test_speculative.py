"""Speculative decoding in `orion serve`, one request at a time (`--batch-slots 0`) and
batching (a request decoding alone verifies its drafts in its slot), through the real
server and the real `openai` client: greedy answers are plain decoding's, streamed or
not, drafts are made and checked (/health counts them), a request naming an adapter
runs without speculation, and a draft model with batching is a start-up error."""

from __future__ import annotations

import subprocess
import sys

import pytest
from child_process import OUTSIDE, child_env

from .conftest import MODEL, Server

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

PROMPT = ("ROMEO:\nBut soft, what light through yonder window breaks?\n"
          "JULIET:\nBut soft, what light through yonder window breaks?\nROMEO:\n")


# the batching server's speculation (5 s) runs with the slow tests; test_batch_speculation
# covers it in the quick run
@pytest.mark.parametrize("slots", ["0", pytest.param("4", marks=pytest.mark.slow)])
def test_speculative_answers_are_plain_decodings(tmp_path, slots):
    pytest.importorskip("uvicorn")
    from lora.conftest import shipped_adapter

    import orion
    from orion.models import default_model_path

    adapter = shipped_adapter(tmp_path / "one", 1)
    s = Server("--batch-slots", slots, "--speculative", "prompt", "--draft-tokens", "7",
               "--adapter-path", f"one={adapter}").wait_ready()
    try:
        client = s.client(timeout=120)
        ask = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0}
        text = client.completions.create(**ask).choices[0].text
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            **ask, stream=True) if c.choices)
        with_adapter = client.completions.create(**{**ask, "model": "one"}).choices[0].text
        health = httpx.get(s.base + "/health").json()
    finally:
        err = s.stop()
    assert "Traceback" not in err
    assert "speculative: prompt lookup" in err
    assert health["speculative"]["drafted"] > 0
    assert 0 <= health["speculative"]["accepted"] <= health["speculative"]["drafted"]
    assert health["speculative"]["declined"] >= 0
    model, _ = orion.load(default_model_path())
    try:
        plain = orion.generate(model, PROMPT, max_tokens=40)
        model.load_adapter(adapter, "one")
        plain_one = orion.generate(model, PROMPT, max_tokens=40, adapter="one")
    finally:
        model.close()
    assert text == streamed == plain
    assert with_adapter == plain_one != plain


def test_a_draft_model_with_batching_is_a_start_up_error(tmp_path):
    run = subprocess.run([sys.executable, "-m", "orion.cli", "serve", "--draft-model",
                          str(tmp_path), "--port", "0"], cwd=OUTSIDE, env=child_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--draft-model works with --batch-slots 0" in run.stderr
    assert "Traceback" not in run.stderr
