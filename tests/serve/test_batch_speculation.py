"""Speculative decoding by prompt lookup inside a batching server
(`orion.serve.batching`, in process): a request decoding alone verifies its drafts in
its slot and gets plain greedy's tokens; requests side by side get theirs too; a
verify handed in while a prompt holds the model's cache runs its first token as a
step's row (decode's bits); the speculative loop checks only the drafts the rows it
got cover; and the requests a batching server speculates, and what it refuses."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest
from copying_task import copying_prompt, save_peaked_tiny_gpt2, tokens

from orion.serve.batching import BatchScheduler

pytestmark = pytest.mark.native

TOKENS = 40


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The peaked GPT-2 (a greedy chain that prompt lookup finds in a copying prompt)."""
    from orion.models import load_model
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)
    folder = save_peaked_tiny_gpt2(tmp_path_factory.mktemp("gpt2") / "g")
    m = load_model(folder, prefill_buckets=(32, 64), decode_buckets=(32, 64, 128))
    yield m
    m.close()
    set_compile_budget(old)


def _tokens(model, prompt, **options):
    return tokens(model, prompt, max_tokens=TOKENS, **options)


@pytest.fixture
def scheduler(gpt2):
    s = BatchScheduler(gpt2, slots=4, verify_rows=8)
    s.start()
    yield s
    s.stop()


def test_a_lone_request_verifies_in_its_slot(gpt2, scheduler):
    prompt = copying_prompt(gpt2, 1)
    plain, _ = _tokens(gpt2, prompt)
    lm = scheduler.slot_lm()
    try:
        got, stats = _tokens(lm, prompt, speculative="prompt")
    finally:
        lm.release()
    assert got == plain
    s = stats.speculation
    assert s.verify_steps >= 3 and s.accepted >= 15
    assert scheduler.verifies == s.verify_steps
    assert scheduler.tokens == s.decode_steps   # the plain steps ran as batch steps


def test_requests_side_by_side_get_plain_greedy(gpt2, scheduler):
    prompts = [copying_prompt(gpt2, seed) for seed in (2, 3, 4)]
    plain = [_tokens(gpt2, p)[0] for p in prompts]
    got: dict[int, list[int]] = {}
    failures: list[BaseException] = []

    def one(i: int) -> None:
        lm = scheduler.slot_lm()
        try:
            got[i] = _tokens(lm, prompts[i], speculative="prompt")[0]
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            lm.release()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    assert [got[i] for i in range(len(prompts))] == plain


def test_a_verify_while_a_prompt_goes_in_is_one_decode_row(gpt2):
    """Run on the test's thread (the scheduler's thread not started): deterministic."""
    prompt = copying_prompt(gpt2, 5)
    first = int(np.argmax(gpt2.prefill(prompt)))
    want = gpt2.decode(first)
    s = BatchScheduler(gpt2, slots=2, verify_rows=8)
    try:
        a = s.batch.acquire()
        s.batch.start(a, prompt)
        s._decoding.add(a)
        b = s.batch.acquire()
        run = s.batch.begin(b, prompt * 2, chunk=8)
        assert s.batch.advance(run) is None and s.batch.staging
        done: Future[np.ndarray] = Future()
        s._run_step({}, {a: ([first, 7, 8, 9], done)})
        rows = done.result(timeout=0)
        assert rows.shape == (1, gpt2.config.vocab_size)
        assert np.array_equal(rows[0], want)
        assert s.batch.position(a) == len(prompt) + 1 and s.verifies == 0
    finally:
        s.stop()


class _OneRow:
    """The model, but its verify runs the first token alone (as a busy slot's does)."""

    def __init__(self, model) -> None:
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def verify(self, tokens):
        return self._model.verify(list(tokens)[:1])


def test_the_loop_checks_only_the_drafts_its_rows_cover(gpt2):
    prompt = copying_prompt(gpt2, 6)
    plain, _ = _tokens(gpt2, prompt)
    got, stats = _tokens(_OneRow(gpt2), prompt, speculative="prompt")
    assert got == plain
    s = stats.speculation
    assert s.verify_steps == 0 and s.accepted == 0 and s.drafted == 0
    assert s.decode_steps == s.tokens


def test_which_requests_a_batching_server_speculates(gpt2):
    """Greedy and unseeded sampling; not a seeded sampled request (its text must not
    depend on the other requests), nor one naming an adapter."""
    from types import SimpleNamespace

    from orion.serve.batch_worker import BatchWorker

    def job(temperature, seed, adapter=None):
        return SimpleNamespace(options=SimpleNamespace(temperature=temperature, seed=seed),
                               target=SimpleNamespace(adapter=adapter))

    worker = BatchWorker(gpt2, slots=2, speculative="prompt", draft_tokens=7)
    try:
        assert worker.scheduler.batch.verify_rows == (8,)
        assert worker._speculation(job(0.0, None)) == {"speculative": "prompt",
                                                       "draft_tokens": 7}
        assert worker._speculation(job(0.0, 5))["speculative"] == "prompt"
        assert worker._speculation(job(0.8, None))["speculative"] == "prompt"
        assert worker._speculation(job(0.8, 5)) == {}
        assert worker._speculation(job(0.0, None, adapter="one")) == {}
    finally:
        worker.scheduler.stop()


def test_a_batching_server_refuses_a_draft_model_and_bad_draft_tokens():
    from orion.errors import InvalidArgumentError
    from orion.serve.batch_worker import BatchWorker

    with pytest.raises(InvalidArgumentError, match="speculates by prompt lookup alone"):
        BatchWorker(object(), speculative=object())
    with pytest.raises(InvalidArgumentError, match=r"draft_tokens must be an integer in 1 \.\. 31"):
        BatchWorker(object(), speculative="prompt", draft_tokens=40)
