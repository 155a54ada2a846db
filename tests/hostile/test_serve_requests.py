"""Class 13: `orion serve` requests. Every field is parsed with bounds, a 400 never a
500 (a max_tokens of 5,000 digits, a stop nested 100k deep and a temperature of 400
digits were 500s; so was a 1 GB chat template render); stream_options.include_usage
must be a bool ("no" still sent usage); stop=[null] is refused; `bearer KEY` is
accepted (RFC 7235: the scheme is case-insensitive) and an empty API key is refused
rather than turning authentication off."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

import orion  # noqa: E402
from hostile.helpers import (  # noqa: E402
    BIG_RENDER,
    assert_one_line_error,
    folder_with_template,
    run_cli,
)

KEY = "s3cret"


@pytest.fixture(scope="module")
def model():
    model, _ = orion.load()
    yield model
    model.close()


@pytest.fixture(scope="module")
def client(model):
    from orion.serve.app import create_app

    with TestClient(create_app(model, name="m"), raise_server_exceptions=False) as c:
        yield c


def _raw(client, path: str, body: str):
    return client.post(path, content=body.encode(),
                       headers={"content-type": "application/json"})


BODIES = {
    "max_tokens of 5,000 digits": '{"model": "m", "prompt": "a", "max_tokens": ' + "9" * 5000
                                  + "}",
    "stop nested 100k deep": '{"model": "m", "prompt": "a", "stop": ' + "[" * 100_000
                             + "]" * 100_000 + "}",
    "temperature of 400 digits": '{"model": "m", "prompt": "a", "temperature": ' + "1" * 400
                                 + "}",
    "seed of 300 digits": '{"model": "m", "prompt": "a", "seed": ' + "7" * 300 + "}",
    "top_p of 1e999": '{"model": "m", "prompt": "a", "top_p": 1e999}',
    "include_usage 'no'": json.dumps({"model": "m", "prompt": "a", "stream": True,
                                      "stream_options": {"include_usage": "no"}}),
    "stop [null]": json.dumps({"model": "m", "prompt": "a", "stop": [None]}),
    "messages nested 100k deep": '{"model": "m", "messages": ' + "[" * 100_000
                                 + "]" * 100_000 + "}",
}


@pytest.mark.parametrize("case", list(BODIES))
def test_a_bad_field_is_a_400_naming_it(client, case):
    path = "/v1/chat/completions" if "messages" in case else "/v1/completions"
    r = _raw(client, path, BODIES[case])
    assert r.status_code == 400, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.slow
def test_include_usage_false_sends_no_usage(client):
    r = client.post("/v1/completions", json={
        "model": "m", "prompt": "ROMEO:", "max_tokens": 2, "stream": True,
        "stream_options": {"include_usage": False}})
    assert r.status_code == 200
    assert '"usage"' not in r.text


def test_a_1_gb_template_render_is_a_400(tmp_path):
    from orion.serve.app import create_app

    model, _ = orion.load(folder_with_template(tmp_path / "m", BIG_RENDER))
    try:
        with TestClient(create_app(model, name="m"), raise_server_exceptions=False) as c:
            r = c.post("/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "x" * 100}]})
    finally:
        model.close()
    assert r.status_code == 400, r.text[:300]
    assert "would pass" in r.json()["error"]["message"]


@pytest.mark.parametrize(("header", "status"), [
    (f"Bearer {KEY}", 200), (f"bearer {KEY}", 200), (f"BEARER {KEY}", 200),
    (f"  bearer   {KEY}  ", 200), ("Bearer wrong", 401), (f"Basic {KEY}", 401),
    ("bearer", 401), ("", 401)])
def test_the_bearer_scheme_is_case_insensitive(model, header, status):
    from orion.serve.app import create_app

    with TestClient(create_app(model, name="m", api_key=KEY)) as c:
        r = c.get("/v1/models", headers={"authorization": header} if header else {})
    assert r.status_code == status, (header, r.text)


def test_an_empty_api_key_is_refused(model, capsys):
    from orion.serve.app import create_app

    for key in ("", "   "):
        with pytest.raises(ValueError, match="empty"):
            with TestClient(create_app(model, name="m", api_key=key)) as c:
                c.get("/v1/models")
        rc, _, err = run_cli(["serve", "--api-key", key], capsys)
        assert "--api-key" in assert_one_line_error(rc, err, "serve")
