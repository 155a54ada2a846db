"""orion.serve.access_log: a line per request (method, path, status, tokens, time) on
the orion.serve logger at INFO; and `orion serve` writes them to stderr by default."""

from __future__ import annotations

import logging
import re

import pytest

from .conftest import MODEL, Server

starlette = pytest.importorskip("starlette")

LINE = re.compile(r'"(\w+) (\S+)" (\d{3})(?: prompt (\d+) \+ completion (\d+) tokens)? '
                  r"(\d+\.\d\d) s")


def _app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from orion.serve.access_log import AccessLog, record

    async def generate(request):
        rec = record(request)
        rec.prompt_tokens, rec.completion_tokens = 7, 3
        return JSONResponse({"ok": True})

    async def boom(request):
        raise RuntimeError("x")

    async def health(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/gen", generate, methods=["POST"]),
                            Route("/boom", boom), Route("/health", health)])
    app.add_middleware(AccessLog)
    return app


def test_a_line_per_request(caplog):
    from starlette.testclient import TestClient

    with caplog.at_level(logging.INFO, logger="orion.serve"), \
            TestClient(_app(), raise_server_exceptions=False) as client:
        client.post("/gen")
        client.get("/health")
        client.get("/nowhere")
        client.get("/boom")
    lines = [r.getMessage() for r in caplog.records if r.name == "orion.serve"]
    got = [LINE.match(line).groups()[:5] for line in lines]
    assert got == [("POST", "/gen", "200", "7", "3"), ("GET", "/health", "200", None, None),
                   ("GET", "/nowhere", "404", None, None), ("GET", "/boom", "500", None, None)]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "orion.serve")


@pytest.mark.slow
def test_orion_serve_logs_requests_by_default():
    openai = pytest.importorskip("openai")
    server = Server().wait_ready()
    try:
        client = server.client(timeout=60)
        out = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=5,
                                        temperature=0)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            temperature=0, stream=True)
        for _ in stream:
            pass
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no-such-model")
    finally:
        err = server.stop()
    lines = {m.group(2): m.groups() for m in map(LINE.search, err.splitlines()) if m}
    assert lines["/v1/completions"][:5] == (
        "POST", "/v1/completions", "200", str(out.usage.prompt_tokens),
        str(out.usage.completion_tokens))
    assert lines["/v1/chat/completions"][2] == "200"
    assert lines["/v1/chat/completions"][3] is not None    # a stream's tokens too
    assert lines["/v1/models/no-such-model"][2] == "404"
    assert " INFO " in err and "Traceback" not in err
