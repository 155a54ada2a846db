"""orion.serve.worker under load, through the real server: 16 concurrent streaming
clients x 4 requests on loopback. Each request completes with exactly the text it
gets alone, or gets 429 with Retry-After; none is cut or mixed with another; clients
that disconnect mid-stream free the device; the server stays healthy."""

from __future__ import annotations

import threading

import pytest

from .conftest import MODEL, Server

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

CLIENTS, REQUESTS, TOKENS = 16, 4, 8
SPEAKERS = ["ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE", "CAPULET", "BENVOLIO", "PARIS",
            "FRIAR", "PRINCE", "LADY", "SAMPSON", "GREGORY", "ABRAHAM", "PETER", "BALTHASAR"]


@pytest.fixture(scope="module")
def loaded():
    pytest.importorskip("uvicorn")
    s = Server("--max-queue", "4").wait_ready()
    yield s
    err = s.stop()
    assert "Traceback" not in err, err


def _prompt(i: int) -> str:
    return f"{SPEAKERS[i]}:\n"


@pytest.mark.slow
def test_concurrent_streams_complete_or_429(loaded):
    client = loaded.client(timeout=120)
    expected = {i: client.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=TOKENS,
                                             temperature=0).choices[0].text
                for i in range(CLIENTS)}
    assert len(set(expected.values())) > 1   # the prompts tell the answers apart
    results: list[tuple[int, str, str | None, set[str]]] = []
    refused: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def one_client(i: int) -> None:
        own = loaded.client(timeout=120)
        for _ in range(REQUESTS):
            try:
                stream = own.completions.create(model=MODEL, prompt=_prompt(i),
                                                max_tokens=TOKENS, temperature=0, stream=True)
                chunks = list(stream)
            except openai.RateLimitError as exc:
                with lock:
                    refused.append(exc.response.headers.get("retry-after", ""))
                continue
            except BaseException as exc:  # noqa: BLE001 - reported below
                with lock:
                    failures.append(exc)
                return
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            with lock:
                results.append((i, text, chunks[-1].choices[0].finish_reason,
                                {c.id for c in chunks}))

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures
    assert len(results) + len(refused) == CLIENTS * REQUESTS
    assert results, "every request was refused"
    assert refused, "16 clients on a queue of 4 never filled it: the 429 path went untested"
    for i, text, finish, ids in results:
        assert text == expected[i], f"client {i}: a cut or mixed answer"
        assert finish in ("length", "stop") and len(ids) == 1
    assert len({next(iter(ids)) for *_, ids in results}) == len(results)
    assert all(r.isdigit() and int(r) >= 1 for r in refused)
    health = httpx.get(loaded.base + "/health").json()
    assert health["status"] == "ok" and health["waiting"] == 0


def test_disconnects_mid_stream_free_the_device(loaded):
    before = httpx.get(loaded.base + "/health").json()

    def leave_early() -> None:
        with httpx.stream("POST", loaded.base + "/v1/completions", timeout=120,
                          json={"model": MODEL, "prompt": "ROMEO:\n", "max_tokens": 200,
                                "temperature": 0, "stream": True}) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n >= 4:
                    return   # closes the connection mid-stream

    threads = [threading.Thread(target=leave_early) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # the server is free again: a full request completes and nothing is left running
    out = loaded.client(timeout=120).completions.create(model=MODEL, prompt="JULIET:\n",
                                                        max_tokens=4, temperature=0)
    assert out.choices[0].finish_reason == "length"
    after = httpx.get(loaded.base + "/health").json()
    assert after["cancelled"] - before["cancelled"] >= 1
    assert after["waiting"] == 0 and not after["busy"]
