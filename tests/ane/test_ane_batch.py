"""Batched decode (orion.models.batch) through the ane backend on the stand-in framework,
against the same on vane: a tiny GPT-2 and a tiny Qwen3 shape (GQA, q/k norms, a RoPE
input [1, 2B, 1, hd]) run a BatchDecoder of 4 slots, three of them live, across two
decode buckets: with the base model, and with two LoRA adapters and none in the same
steps (per-row LoRA inputs) after a prompt put in by chunks (the verify programs); and
three short prompts in one prompt pack (x and a rope input of 32 columns). The
stand-in evaluates each batch program only when its surfaces pass the device's checks
(one size per group, ANE-C17/C18; at least 49152 bytes, ANE-C23; none smaller than its
tensor, ANE-C25; bound by sorted name, ANE-C20) and computes with vane, so every logit
must be the same bits as vane's. These run where the library was built with the ane
backend against the stand-in (tests/ane/build_standin.sh, once per stand-in mode);
elsewhere they skip, saying so."""

from __future__ import annotations

import os

import numpy as np
import pytest
from models.conftest import TINY, random_adapter, save_peaked_gpt2
from models.hf_fixtures import save_numpy_init, shrunk

from orion.models import load_model
from orion.models.batch import BatchDecoder

from .test_ane_backend import standin  # noqa: F401 - the fixture

pytestmark = pytest.mark.native

STEPS = 4       # prompts of 5, 17 and 30 tokens: the 30 crosses from bucket 32 to 64
SLOTS = 4       # one slot left free: its rows are padding the programs must not read
PROMPTS = (5, 17, 30)
VOCAB = 4096    # the head's chunks are not what is checked here: a small one is quicker


@pytest.fixture(scope="module", params=["gpt2", "Qwen3-0.6B"])
def folder(request, tmp_path_factory):
    where = tmp_path_factory.mktemp(request.param)
    if request.param == "gpt2":
        return save_peaked_gpt2(where, {**TINY, "vocab_size": VOCAB})
    return save_numpy_init(where, {**shrunk(request.param), "vocab_size": VOCAB})


@pytest.fixture(scope="module")
def compiles_given_back(standin):  # noqa: F811
    """The stand-in refuses compiles past its per-process limit (ANE-C31: 119, or
    ANE_STANDIN_COMPILE_LIMIT), and build_standin.sh runs the runtime tests and all of
    tests/ane in one process, training's delta path (which compiles on every load in
    compile-on-miss) last and near that limit: the compiles this module makes are
    given back when it ends, so the tests after it see the process they would
    without it."""
    start = standin.lib.ane_standin_compiles()
    yield
    used = standin.lib.ane_standin_compiles() - start
    limit = int(os.environ.get("ANE_STANDIN_COMPILE_LIMIT") or 119)
    standin.lib.ane_standin_set_compile_limit(limit + used)


def _batched(folder, backend: str, mixed: bool = False
             ) -> tuple[list[dict[int, np.ndarray]], list[int]]:
    """The logits of every slot after its prompt and after each greedy step, and the
    bucket of each step. `mixed`: the slots' prompts go in with LoRA adapters "one"
    and "two" and, for the third, none and in chunks of 8 + 22 (the verify programs);
    the steps then run the per-row LoRA batch programs."""
    model = load_model(folder, backend=backend, prefill_buckets=(32, 64),
                       decode_buckets=(32, 64, 128))
    try:
        rng = np.random.default_rng(1)
        prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in PROMPTS]
        names: list[str | None] = [None, None, None]
        if mixed:
            mods = model.arch.linear_modules()
            model.adapters.add(random_adapter(model.arch, (mods[0],), 4, 1), "one")
            model.adapters.add(random_adapter(model.arch, tuple(mods[-2:]), 8, 2), "two")
            names = ["one", "two", None]
        with BatchDecoder(model, slots=SLOTS) as batch:
            slots = [batch.acquire() for _ in prompts]
            logits = {s: batch.start(s, p, chunk=8 if mixed else None, adapter=name)
                      for s, p, name in zip(slots, prompts, names, strict=True)}
            seen, buckets = [logits], []
            for _ in range(STEPS):
                logits = batch.step({s: int(np.argmax(v)) for s, v in logits.items()})
                seen.append(logits)
                buckets.append(batch.bucket)
        return seen, buckets
    finally:
        model.close()


@pytest.mark.parametrize("mixed", [False, True], ids=["base", "adapters+chunks"])
def test_batch_programs_run_on_ane_as_on_vane(standin, compiles_given_back, folder,  # noqa: F811
                                              no_leaks, mixed):
    want, want_buckets = _batched(folder, "vane", mixed)
    standin.lib.ane_standin_log_clear()
    got, buckets = _batched(folder, "ane", mixed)
    log = standin.log()
    assert "0x1d" not in log, log[-2000:]
    assert standin.violations() == ""
    # every step and prompt went through the stand-in's evaluate
    assert log.count("evaluateWithQoS:options:request:error:] qos=21") >= STEPS
    assert buckets == want_buckets and buckets[0] == 32 and buckets[-1] == 64
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert sorted(g) == sorted(w) == [0, 1, 2]
        for s in w:
            assert np.array_equal(g[s], w[s]), f"step {step}, slot {s}"


def _packed(folder, backend: str) -> list[dict[int, np.ndarray]]:
    """Three short prompts in one pack (`BatchDecoder.pack`), their logits from the batch
    head, then two greedy steps."""
    model = load_model(folder, backend=backend, prefill_buckets=(32,), decode_buckets=(32,))
    try:
        rng = np.random.default_rng(2)
        prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (3, 1, 4)]
        with BatchDecoder(model, slots=SLOTS) as batch:
            assert batch.plan_packs()
            slots = [batch.acquire() for _ in prompts]
            batch.pack(dict(zip(slots, prompts, strict=True)))
            seen = [batch.heads()]
            for _ in range(2):
                seen.append(batch.step({s: int(np.argmax(v)) for s, v in seen[-1].items()}))
        return seen
    finally:
        model.close()


def test_prompt_packs_run_on_ane_as_on_vane(standin, compiles_given_back, folder,  # noqa: F811
                                            no_leaks):
    want = _packed(folder, "vane")
    standin.lib.ane_standin_log_clear()
    got = _packed(folder, "ane")
    assert standin.violations() == ""
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert sorted(g) == sorted(w) == [0, 1, 2]
        for s in w:
            assert np.array_equal(g[s], w[s]), f"step {step}, slot {s}"
