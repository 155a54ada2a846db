"""orion.serve.app through the real server (a subprocess on 127.0.0.1) and the real
`openai` client: completions, chat, streaming, stop strings, seeds, the prompt
cache, errors, auth."""

from __future__ import annotations

import json

import pytest

from .conftest import MODEL, Server

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

PROMPT = "ROMEO:\nWhat light"
CHAT = [{"role": "system", "content": "A scene in Verona."},
        {"role": "user", "content": "Who goes there?"}]


def test_models_and_health(server):
    client = server.client()
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(server.base + "/health").json()
    assert health["status"] == "ok" and health["max_queue"] == 8


@pytest.mark.slow
def test_completion_equals_in_process_generate(server):
    import orion
    from orion.models import default_model_path

    out = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                             temperature=0)
    choice = out.choices[0]
    model, tok = orion.load(default_model_path())
    try:
        expected = orion.generate(model, PROMPT, max_tokens=24)
        assert choice.text == expected
        assert out.usage.prompt_tokens == len(tok.encode(PROMPT))
    finally:
        model.close()
    assert choice.finish_reason == "length" and out.usage.completion_tokens == 24
    assert out.usage.total_tokens == out.usage.prompt_tokens + 24


def test_streaming_equals_non_streaming(server):
    """The same request, streamed or not, from the same prompt-cache state: a first
    request leaves PROMPT in the cache, so both below reuse it alike. (Whether an answer
    depends on what the cache held, through fp16 rounding of prefill against decode, is
    issue 29's batch- and cache-invariance.)"""
    client = server.client()
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20,
                                      temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1

    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30,
                                          temperature=0)
    stream = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content
    assert stream[0].choices[0].delta.role == "assistant"
    assert stream[-1].usage.completion_tokens == chat.usage.completion_tokens
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_stop_strings(server):
    client = server.client()
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40,
                                     temperature=0).choices[0].text
    stop = full[10:14]
    cut = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40,
                                    temperature=0, stop=[stop, "zzzz"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[:full.index(stop)]


def test_seed_reproducibility(server):
    client = server.client()

    def sample(seed):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                         temperature=1.0, seed=seed).choices[0].text

    a, b, c = sample(7), sample(7), sample(8)
    assert a == b
    assert a != c


def test_chat_turn_reuses_the_cache(server):
    client = server.client()
    first = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12,
                                           temperature=0)
    follow = CHAT + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Speak again."}]
    second = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=12,
                                            temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    assert cached >= first.usage.prompt_tokens


def test_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError) as info:
        server.client().completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    ({"prompt": "x", "temperature": 7}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "logprobs": 3}, "logprobs"),
    ({"prompt": {"a": 1}}, "prompt"),
    ({"prompt": [99999999]}, "prompt"),
    ({"prompt": "word " * 400}, "prompt"),
])
def test_bad_values_are_400(server, body, param):
    r = httpx.post(server.base + "/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_requests(server):
    post = httpx.post
    r = post(server.base + "/v1/chat/completions", content=b"{not json",
             headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert post(server.base + "/v1/chat/completions", json=[1]).status_code == 400
    r = post(server.base + "/v1/chat/completions", json={"model": MODEL, "messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = post(server.base + "/v1/completions", content=b"\xff\xfe" * 10)
    assert r.status_code == 400
    r = post(server.base + "/v1/completions", content=b"x" * (5 << 20))
    assert r.status_code == 413
    # JSON may escape a lone surrogate, which no tokenizer can encode
    lone = "\\udcff"   # the six characters of a JSON escape
    r = post(server.base + "/v1/chat/completions", content=json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "bad X"}]}).replace("X", lone))
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]
    r = post(server.base + "/v1/completions",
             content=json.dumps({"model": MODEL, "prompt": "x X"}).replace("X", lone))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.get(server.base + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.base + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    r = post(server.base + "/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                    "max_tokens": 2, "stream": "yes"})
    assert r.status_code == 400


def test_api_key():
    pytest.importorskip("uvicorn")
    server = Server("--api-key", "s3cret").wait_ready()
    try:
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").models.list()
        r = httpx.get(server.base + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert server.client(api_key="s3cret").models.list().data[0].id == MODEL
        assert httpx.get(server.base + "/health").status_code == 200
    finally:
        server.stop()


@pytest.mark.slow
def test_non_loopback_warns_without_a_key():
    pytest.importorskip("uvicorn")
    server = Server(host="0.0.0.0").wait_ready()
    err = server.stop()
    assert "no authentication" in err
    server = Server("--api-key", "k", host="0.0.0.0").wait_ready()
    assert "no authentication" not in server.stop()


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    from lora.conftest import shipped_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {name: shipped_adapter(root / name, seed) for name, seed in (("one", 1), ("two", 2))}


@pytest.mark.slow
def test_adapters_per_request_by_model_name(adapter_dirs):
    import orion
    from orion.models import default_model_path

    s = Server("--adapter-path", f"one={adapter_dirs['one']}",
               "--adapter-path", f"two={adapter_dirs['two']}").wait_ready()
    try:
        client = s.client()
        assert [m.id for m in client.models.list().data] == [MODEL, "one", "two"]

        def complete(name):
            return client.completions.create(model=name, prompt=PROMPT, max_tokens=16,
                                             temperature=0).choices[0].text

        first = {name: complete(name) for name in (MODEL, "one", "two")}
        compiled = httpx.get(s.base + "/health").json()["programs_compiled"]
        for name in ("two", MODEL, "one", f"{MODEL}:two", "one", MODEL):
            assert complete(name) == first[name.rpartition(":")[2]]
        assert httpx.get(s.base + "/health").json()["programs_compiled"] == compiled
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=f"{MODEL}:three", prompt=PROMPT, max_tokens=2)
    finally:
        assert "Traceback" not in s.stop()
    model, _ = orion.load(default_model_path())
    try:
        for name in ("one", "two"):
            model.load_adapter(adapter_dirs[name], name)
        expected = {name: orion.generate(model, PROMPT, max_tokens=16, adapter=name)
                    for name in (None, "one", "two")}
    finally:
        model.close()
    assert first == {MODEL: expected[None], "one": expected["one"], "two": expected["two"]}
    assert len(set(first.values())) == 3     # the adapters change the text


def test_bad_adapter_path_is_a_start_up_error(tmp_path):
    s = Server("--adapter-path", f"x={tmp_path / 'missing'}")
    s.proc.wait(timeout=60)
    err = s.stop()
    assert s.proc.returncode != 0 and "not an adapter folder" in err
    assert "Traceback" not in err
