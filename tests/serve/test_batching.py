"""Continuous batching in `orion serve` (orion.serve.batch_worker), through the real
server and the real `openai` client: 16 concurrent clients on 8 slots each get
exactly the text their request gets served alone (greedy and seeded sampling), none
is lost, a greedy answer beside other streams is `orion.generate`'s, answers do not
depend on the requests served before, and /health reports the slots, the queue and
the token rate."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from child_process import OUTSIDE, child_env

from .conftest import MODEL, Server

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

CLIENTS, TOKENS = 16, 12
SPEAKERS = ["ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE", "CAPULET", "BENVOLIO", "PARIS",
            "FRIAR", "PRINCE", "LADY", "SAMPSON", "GREGORY", "ABRAHAM", "PETER", "BALTHASAR"]


@pytest.fixture(scope="module")
def batching():
    pytest.importorskip("uvicorn")
    s = Server("--batch-slots", "8", "--max-queue", "16").wait_ready()
    yield s
    err = s.stop()
    assert "Traceback" not in err, err


def _request(i: int) -> dict:
    """Greedy for even i, seeded sampling for odd i."""
    body = {"model": MODEL, "prompt": f"{SPEAKERS[i]}:\n", "max_tokens": TOKENS}
    return {**body, "temperature": 0} if i % 2 == 0 else \
        {**body, "temperature": 0.8, "seed": 100 + i}


def test_concurrent_clients_get_their_alone_answers(batching):
    client = batching.client(timeout=300)
    alone = {i: client.completions.create(**_request(i)).choices[0].text
             for i in range(CLIENTS)}
    assert len(set(alone.values())) > 1
    got: dict[int, str] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            chunks = list(batching.client(timeout=300).completions.create(
                **_request(i), stream=True))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            with lock:
                got[i] = text
        except BaseException as exc:  # noqa: BLE001 - reported below
            with lock:
                failures.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures
    assert sorted(got) == list(range(CLIENTS)), "a request was lost"
    for i in range(CLIENTS):
        assert got[i] == alone[i], f"client {i}: its answer changed beside the others"
    health = httpx.get(batching.base + "/health").json()
    assert health["slots"] == 8 and health["waiting"] == 0 and health["running"] == 0
    assert health["tokens_per_s"] > 0


def test_a_batched_answer_equals_in_process_generate(batching):
    """Beside 7 other streams, greedy: the very text `orion.generate` gives (the batch
    rows compute each request's logits as the one-token decode does, bit for bit)."""
    import orion
    from orion.models import default_model_path

    prompt = "ROMEO:\nBut soft, what light"
    others: list[str] = []

    def other(i: int) -> None:
        others.append(batching.client(timeout=120).completions.create(
            **{**_request(i), "max_tokens": 40}).choices[0].text)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(1, 8)]
    for t in threads:
        t.start()
    out = batching.client(timeout=120).completions.create(model=MODEL, prompt=prompt,
                                                          max_tokens=24, temperature=0)
    for t in threads:
        t.join(timeout=300)
    assert len(others) == 7
    model, _ = orion.load(default_model_path())
    try:
        assert out.choices[0].text == orion.generate(model, prompt, max_tokens=24)
    finally:
        model.close()


def test_an_answer_does_not_depend_on_earlier_requests(batching):
    client = batching.client(timeout=120)
    ask = {"model": MODEL, "prompt": "ROMEO:\nWhat light", "max_tokens": 10, "temperature": 0}
    first = client.completions.create(**ask).choices[0].text
    # a request sharing its prefix, and a long unrelated one, in between
    client.completions.create(model=MODEL, prompt="ROMEO:\nWhat", max_tokens=20,
                              temperature=0)
    client.completions.create(model=MODEL, prompt="JULIET:\n" * 10, max_tokens=5,
                              temperature=0)
    again = client.completions.create(**ask)
    assert again.choices[0].text == first
    assert again.usage.prompt_tokens_details is None or \
        not again.usage.prompt_tokens_details.cached_tokens


def test_a_long_prompt_in_chunks_is_its_alone_answer(batching):
    """A prompt past the first chunk (128 tokens) goes in by chunks between the other
    streams' steps: greedy, its text is the one it gets served alone, and asked again
    (its prefix now shared from the first time) still the same."""
    client = batching.client(timeout=300)
    ask = {"model": MODEL, "prompt": "ROMEO:\nBut soft, what light through yonder window "
           "breaks? It is the east, and Juliet is the sun.\n" * 6, "max_tokens": 16,
           "temperature": 0}
    alone = client.completions.create(**ask)
    assert alone.usage.prompt_tokens > 160, "the prompt must take more than one chunk"
    others: list[str] = []

    def other(i: int) -> None:
        others.append(batching.client(timeout=300).completions.create(
            **{**_request(i), "max_tokens": 40}).choices[0].text)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(1, 6)]
    for t in threads:
        t.start()
    beside = client.completions.create(**ask)
    for t in threads:
        t.join(timeout=300)
    assert len(others) == 5
    assert beside.choices[0].text == alone.choices[0].text
    # the second time, its prefix up to its last chunk cut came from the first's rows
    assert not alone.usage.prompt_tokens_details.cached_tokens
    cut = 128 + 32 * ((alone.usage.prompt_tokens - 129) // 32)
    assert beside.usage.prompt_tokens_details.cached_tokens == cut


# a round longer than the prompt (5 s of test) runs with the slow tests
@pytest.mark.parametrize("round_s", [0.0, pytest.param(60.0, marks=pytest.mark.slow)])
def test_running_streams_step_between_a_long_prompts_chunks(round_s):
    """While a 100-token prompt goes in by chunks of 8 + 32, the request already
    decoding gets a step once `prompt_round_s` of chunks has run: between every two
    chunks with a round of 0, none with a round longer than the whole prompt."""
    import numpy as np

    import orion
    from orion.models import default_model_path
    from orion.serve.batching import BatchScheduler

    model, _ = orion.load(default_model_path())
    scheduler = BatchScheduler(model, slots=2, prefill_chunk=8, prompt_round_s=round_s)
    scheduler.start()
    try:
        running = scheduler.slot_lm()
        logits = running.prefill([1, 2, 3])
        stop = threading.Event()

        def decode() -> None:
            tok = int(np.argmax(logits))
            while not stop.is_set() and running.position < 120:
                tok = int(np.argmax(running.decode(tok)))

        # the steps run before each of the long prompt's chunks, counted on the
        # scheduler's thread (counting around `prefill` here also caught a step that
        # ended between the count and the prompt's hand-in)
        advance, steps_at = scheduler.batch.advance, []

        def counted(run, **kwargs):
            steps_at.append(scheduler.steps)
            return advance(run, **kwargs)

        scheduler.batch.advance = counted
        t = threading.Thread(target=decode)
        t.start()
        long = scheduler.slot_lm()
        long.prefill(list(range(1, 101)))
        long.release()   # a step waits for every decoding slot's token: leave now
        stop.set()
        t.join(timeout=60)
        assert len(steps_at) == 4   # chunks of 8, 32, 32 and 28
        during = steps_at[-1] - steps_at[0]
        if round_s:
            assert during == 0, f"{during} steps while the prompt's round went on"
        else:
            assert during >= 2, f"{during} steps while 3 chunks went in"
        running.release()
    finally:
        scheduler.stop()
        model.close()


def test_prompts_waiting_together_go_in_by_one_pack():
    """Short prompts waiting together go in by one pack eval (`BatchDecoder.pack`), and
    each request's logits, after its prompt and after each greedy step, are the very
    bits it gets served alone."""
    import time

    import numpy as np

    import orion
    from orion.models import default_model_path
    from orion.serve.batching import BatchScheduler

    model, _ = orion.load(default_model_path())
    prompts = [[5, 6, 7], [9], [11, 12, 13, 14], [20, 21]]

    def serve(together: bool) -> tuple[dict[int, list[np.ndarray]], int]:
        scheduler = BatchScheduler(model, slots=len(prompts))
        seen: dict[int, list[np.ndarray]] = {}

        def one(i: int, lm) -> None:
            out = [lm.prefill(prompts[i])]
            for _ in range(3):
                out.append(lm.decode(int(np.argmax(out[-1]))))
            seen[i] = out
            lm.release()

        try:
            if together:   # every prompt waits before the scheduler's thread starts
                threads = [threading.Thread(target=one, args=(i, scheduler.slot_lm()))
                           for i in range(len(prompts))]
                for t in threads:
                    t.start()
                while scheduler.prompts_waiting < len(prompts):
                    time.sleep(0.01)
                scheduler.start()
                for t in threads:
                    t.join(timeout=120)
            else:
                scheduler.start()
                for i in range(len(prompts)):
                    one(i, scheduler.slot_lm())
            return seen, scheduler.packs
        finally:
            scheduler.stop()

    try:
        alone, alone_packs = serve(False)
        together, packs = serve(True)
    finally:
        model.close()
    assert (alone_packs, packs) == (len(prompts), 1)
    for i in range(len(prompts)):
        for step, (got, want) in enumerate(zip(together[i], alone[i], strict=True)):
            assert np.array_equal(got, want), f"prompt {i}, step {step}"


def test_requests_with_different_adapters_share_the_batch(tmp_path):
    """Requests naming two LoRA adapters and the base model, 9 at once on 8 slots:
    they decode in the same steps (each row with its own adapter), and each gets the
    text it gets served alone."""
    pytest.importorskip("uvicorn")
    from lora.conftest import shipped_adapter

    paths = {name: shipped_adapter(tmp_path / name, seed) for name, seed in (("one", 1),
                                                                            ("two", 2))}
    s = Server("--batch-slots", "8", "--adapter-path", f"one={paths['one']}",
               "--adapter-path", f"two={paths['two']}").wait_ready()
    try:
        client = s.client(timeout=300)
        asks = [{"model": name, "prompt": f"{SPEAKERS[i]}:\n", "max_tokens": 16,
                 "temperature": 0} for i in range(3) for name in (MODEL, "one", "two")]
        alone = [client.completions.create(**ask).choices[0].text for ask in asks]
        for i in range(3):   # each adapter changes what the same prompt gets
            assert len(set(alone[3 * i: 3 * i + 3])) == 3, alone[3 * i: 3 * i + 3]
        got: dict[int, str] = {}

        def one(i: int) -> None:
            got[i] = s.client(timeout=300).completions.create(**asks[i]).choices[0].text

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert [got.get(i) for i in range(len(asks))] == alone
    finally:
        assert "Traceback" not in s.stop()


def test_a_prompt_longer_than_a_slot_is_a_400(tmp_path):
    pytest.importorskip("uvicorn")
    s = Server("--batch-slots", "2", "--batch-context", "300").wait_ready()   # bucket 256
    try:
        client = s.client(timeout=60)
        with pytest.raises(openai.BadRequestError, match="context is 256 tokens"):
            client.completions.create(model=MODEL, prompt="ROMEO " * 300, max_tokens=4)
        out = client.completions.create(model=MODEL, prompt="ROMEO " * 200, max_tokens=200,
                                        temperature=0)
        assert out.choices[0].finish_reason == "length"
        # the slot's 256 positions hold all but the last token, sampled from the last
        assert out.usage.prompt_tokens + out.usage.completion_tokens == 257
    finally:
        assert "Traceback" not in s.stop()


def test_prompt_cache_with_batching_is_a_start_up_error():
    run = subprocess.run([sys.executable, "-m", "orion.cli", "serve", "--batch-slots", "4",
                          "--prompt-cache", "always", "--port", "0"], cwd=OUTSIDE,
                         env=child_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "--prompt-cache works with --batch-slots 0" in run.stderr
    assert "Traceback" not in run.stderr
