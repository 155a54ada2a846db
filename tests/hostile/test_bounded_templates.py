"""Class 10: a model folder's chat template cannot hang or exhaust a process, or hold
a server's thread. A template with nested range(100000) loops hung the API and
`orion chat`, and in `orion serve` used up the thread pool while /health said ok; a
100k-step namespace concatenation hung too; `{{ 'x' * 10**9 }}` raised a raw
MemoryError, 5,000 nested ifs a RecursionError, and a 1 GB render was a 500. Each is
now a ChatTemplateError (an OrionError) within the render budget, a 400 in serve."""

from __future__ import annotations

import asyncio
import time

import pytest

from hostile.helpers import BIG_RENDER, assert_one_line_error, folder_with_template, run_cli
from orion.errors import OrionError

HANG = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        "{{ messages[0]['content'] }}")
NAMESPACE = ("{% set ns = namespace(s='') %}{% for i in range(100000) %}"
             "{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxxxxxx' %}{% endfor %}{{ ns.s|length }}")
RENDER_CASES = {
    "nested range loops": (HANG, "longer than"),
    "namespace concatenation": (NAMESPACE, "longer than|would pass"),
    "'x' * 10**9": ("{{ 'x' * 10**9 }}", "would pass"),
    "10 ** 1000000000": ("{{ 10 ** 1000000000 }}", "would pass"),
    "1 GB render": (BIG_RENDER, "would pass"),
    "center(10**9)": ("{{ 'x'|center(10**9) }}", "would pass"),
    "str.ljust(10**9)": ("{{ 'x'.ljust(10**9) }}", "would pass"),
    "replace into every gap": ("{{ ('x' * 1000000).replace('', 'yyyyyyyyyyyyyyyyyyyy') }}",
                               "would pass"),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                        "too deeply"),
}
LOAD_CASES = {
    "5,000 nested ifs": "{% if true %}" * 5000 + "x" + "{% endif %}" * 5000,
    "5,000 nested brackets": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "a 5,000-filter chain": "{{ 1" + "|abs" * 5000 + " }}",
    "30 nested loops": "{% for i in [1] %}" * 30 + "{% endfor %}" * 30,
}
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RENDER_CASES))
def test_render_ends_in_a_typed_error_within_its_budget(tmp_path, case):
    from orion.tokenizers import load_tokenizer
    from orion.tokenizers.chat_template import RENDER_SECONDS

    template, reason = RENDER_CASES[case]
    tok = load_tokenizer(folder_with_template(tmp_path / "m", template))
    t0 = time.monotonic()
    with pytest.raises(OrionError, match=reason):
        tok.apply_chat_template(MESSAGES)
    assert time.monotonic() - t0 < RENDER_SECONDS + 10


@pytest.mark.parametrize("case", list(LOAD_CASES))
def test_deep_nesting_is_refused_when_the_model_loads(tmp_path, case):
    import orion

    folder = folder_with_template(tmp_path / "m", LOAD_CASES[case])
    with pytest.raises(OrionError, match="chat_template.jinja.*(nested|deeply)"):
        model, _ = orion.load(folder)
        model.close()


@pytest.mark.slow
def test_a_template_that_renders_still_renders_after_a_hang(tmp_path):
    """The interrupt that stopped one render never reaches the next call."""
    from orion.tokenizers import load_tokenizer

    bad = load_tokenizer(folder_with_template(tmp_path / "bad", HANG))
    good = load_tokenizer(folder_with_template(tmp_path / "good", "{{ messages[0].content }}!"))
    with pytest.raises(OrionError):
        bad.apply_chat_template(MESSAGES)
    for _ in range(200):
        assert good.apply_chat_template(MESSAGES) == "hi!"
    time.sleep(0.2)
    assert good.apply_chat_template(MESSAGES) == "hi!"


@pytest.mark.slow
def test_orion_chat_with_a_hanging_template_is_one_line(tmp_path, capsys, monkeypatch):
    folder = folder_with_template(tmp_path / "m", HANG)
    lines = iter(["hello"])

    def answer(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", answer)
    rc, _, err = run_cli(["chat", "--model", str(folder)], capsys)
    assert "longer than" in assert_one_line_error(rc, err, "chat")


@pytest.mark.slow
def test_serve_answers_400_and_keeps_its_threads(tmp_path):
    """45 chat requests with a template that never ends (more than the server's 40
    threads): each is a 400 once its render's budget runs out, and a completion after
    them runs; /health stays truthful."""
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from serve.conftest import Server

    server = Server("--model", str(folder_with_template(tmp_path / "m", HANG)),
                    "--max-queue", "64").wait_ready()
    try:
        async def flood() -> list:
            async with httpx.AsyncClient(base_url=server.base, timeout=120) as client:
                body = {"model": "m", "messages": MESSAGES, "max_tokens": 2}
                return await asyncio.gather(*(client.post("/v1/chat/completions", json=body)
                                              for _ in range(45)))

        t0 = time.monotonic()
        answers = asyncio.run(flood())
        assert time.monotonic() - t0 < 90
        assert {a.status_code for a in answers} == {400}
        assert "longer than" in answers[0].json()["error"]["message"]
        done = httpx.post(server.base + "/v1/completions", timeout=60,
                          json={"model": "m", "prompt": "ROMEO:", "max_tokens": 2})
        assert done.status_code == 200, done.text
        assert httpx.get(server.base + "/health", timeout=10).json()["status"] == "ok"
    finally:
        err = server.stop()
    assert "Traceback" not in err, err
