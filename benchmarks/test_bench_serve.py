"""`orion serve` on the shipped model, measured as clients see it over loopback:
time to first token (TTFT) and completion tokens/s for 1, 4 and 16 concurrent
streaming clients, and the TTFT of a follow-up chat turn with and without the
prompt cache. The server runs in a subprocess (as a user runs it); the clients are
threads in this process. Printed in the figures table, never asserted.

The follow-up turn is also measured on a GPT-2 (KV-cache decode, long system message),
where reusing the cache pays.

Not measured here (see docs/serve.md): a llama.cpp server peer on the same weights
(no llama.cpp build on this machine), and a Qwen3-0.6B-shaped model (the model
support is another branch's).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]
MODEL = "shakespeare-llama"
TOKENS = 32
SPEAKERS = ["ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE", "CAPULET", "BENVOLIO", "PARIS",
            "FRIAR", "PRINCE", "LADY", "SAMPSON", "GREGORY", "ABRAHAM", "PETER", "BALTHASAR"]


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "orion.cli", "serve", "--port", str(port),
                             "--max-queue", "64", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError("the server did not come up")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def _stream(base: str, path: str, body: dict) -> tuple[float, int, float]:
    """(seconds to the first text, completion tokens, total seconds) of one request."""
    t0 = time.perf_counter()
    first = None
    tokens = 0
    with httpx.stream("POST", base + path, json={**body, "stream": True,
                                                 "stream_options": {"include_usage": True}},
                      timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            choice = (chunk.get("choices") or [{}])[0]
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text and first is None:
                first = time.perf_counter() - t0
    return first or float("nan"), tokens, time.perf_counter() - t0


@pytest.fixture(scope="module")
def server():
    proc, base = _start()
    _stream(base, "/v1/completions", {"model": MODEL, "prompt": "ROMEO:\n", "max_tokens": 4})
    yield base
    _stop(proc)


@pytest.mark.parametrize("clients", [1, 4, 16])
def test_concurrent_clients(benchmark, figures, server, clients):
    results: list[tuple[float, int, float]] = []

    def one(i: int) -> None:
        results.append(_stream(server, "/v1/completions", {
            "model": MODEL, "prompt": f"{SPEAKERS[i % 16]}:\n", "max_tokens": TOKENS,
            "temperature": 0}))

    def run() -> float:
        results.clear()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    wall = benchmark.pedantic(run, rounds=1, iterations=1)
    wall = wall if wall is not None else run()
    ttft = [r[0] for r in results]
    tokens = sum(r[1] for r in results)
    figures.add(f"serve shipped model, {clients} clients: median TTFT",
                1e3 * statistics.median(ttft), "ms")
    figures.add(f"serve shipped model, {clients} clients: worst TTFT", 1e3 * max(ttft), "ms")
    figures.add(f"serve shipped model, {clients} clients: completion tokens/s (all clients)",
                tokens / wall, "tok/s")


def _follow_up_ttft(base: str, model: str, system: str) -> tuple[float, int]:
    """(time to the first token of the second turn, its cached prompt tokens): the
    second turn asks for one token, so its latency is the prompt's (prefill or cache
    extension) plus one sampling step, whatever text the token makes."""
    chat = [{"role": "system", "content": system},
            {"role": "user", "content": "Who goes there? Stand, and unfold yourself."}]
    first = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": chat, "max_tokens": 16, "temperature": 0}).json()
    chat += [first["choices"][0]["message"],
             {"role": "user", "content": "Long live the king!"}]
    t0 = time.perf_counter()
    second = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": chat, "max_tokens": 1, "temperature": 0}).json()
    return time.perf_counter() - t0, second["usage"]["prompt_tokens_details"]["cached_tokens"]


def _cache_policies(figures, what: str, model: str, system: str, *args: str) -> None:
    times = {}
    for label in ("always", "auto", "off"):
        proc, base = _start("--prompt-cache", label, *args)
        try:
            _follow_up_ttft(base, model, system)   # compiles the programs
            runs = [_follow_up_ttft(base, model, system) for _ in range(5)]
        finally:
            _stop(proc)
        times[label] = statistics.median(t for t, _ in runs)
        figures.add(f"serve {what}: follow-up chat turn TTFT, prompt cache {label} "
                    f"({runs[-1][1]} tokens cached)", 1e3 * times[label], "ms")
    figures.ratio(f"serve {what}: follow-up TTFT, cache always / off", times["always"],
                  times["off"], better="lower")
    figures.ratio(f"serve {what}: follow-up TTFT, cache auto / off", times["auto"],
                  times["off"], better="lower")


def test_prompt_cache_follow_up_turn(figures):
    """The shipped Llama: its decode re-runs the prefix (no KV-cache decode yet)."""
    _cache_policies(figures, "shipped model", MODEL, "A street in Verona.")


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=6)   # GPT-2 small's width, half its layers
    folder = tmp_path_factory.mktemp("gpt2-6l")
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def test_prompt_cache_follow_up_turn_gpt2(figures, gpt2_folder):
    """GPT-2 (768 wide, 6 layers, random weights) has a KV-cache decode, and a long
    system message makes the prefill the cache saves worth saving."""
    system = "You are a careful assistant who answers in verse. " * 30   # ~330 tokens
    _cache_policies(figures, "GPT-2 6x768", gpt2_folder.name, system,
                    "--model", str(gpt2_folder))
