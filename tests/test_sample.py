"""orion.sample against transformers' logits processors, plus the sampler's own rules."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import EvalError
from orion.sample import (
    Sampler,
    SamplingOptions,
    apply_repetition_penalty,
    top_k_mask,
    top_p_mask,
)


def logits_of(seed: int, n: int = 1000) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, n).astype(np.float32)


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("torch", reason="the reference processors need torch (test-only)")
    return pytest.importorskip("transformers", reason="reference processors are test-only")


def hf_apply(processor, logits, previous=()):
    import torch

    ids = torch.tensor([list(previous) or [0]])
    out = processor(ids, torch.tensor(logits, dtype=torch.float64)[None].clone())
    return out[0].numpy()


@pytest.mark.parametrize("k", [1, 5, 50, 999])
def test_top_k_matches_transformers(hf, k):
    x = logits_of(k).astype(np.float64)
    ref = hf_apply(hf.TopKLogitsWarper(top_k=k), x)
    np.testing.assert_array_equal(top_k_mask(x, k), ref)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_matches_transformers(hf, p):
    x = logits_of(int(p * 1000)).astype(np.float64)
    ref = hf_apply(hf.TopPLogitsWarper(top_p=p), x)
    np.testing.assert_array_equal(np.isinf(top_p_mask(x, p)), np.isinf(ref))


def test_repetition_penalty_matches_transformers(hf):
    x = logits_of(7).astype(np.float64)
    previous = [3, 17, 17, 999, 0]
    ref = hf_apply(hf.RepetitionPenaltyLogitsProcessor(penalty=1.3), x, previous)
    np.testing.assert_allclose(apply_repetition_penalty(x, previous, 1.3), ref, rtol=1e-12)


def test_greedy_is_argmax_and_lowest_id_wins_ties():
    x = logits_of(1)
    assert Sampler()(x) == int(np.argmax(x))
    tie = np.zeros(10, np.float32)
    tie[[4, 7]] = 1.0
    assert Sampler()(tie) == 4


@pytest.mark.parametrize("case", ["nan first", "nan after max", "+inf", "-inf", "all -inf"])
def test_greedy_reads_nan_and_inf_as_finite_logits_does(case):
    """NaN is never chosen and +inf is the largest value (the first of them wins),
    whichever path greedy takes (a plain argmax would pick a NaN first, numpy ordering
    it above all)."""
    x = logits_of(3, 50)
    best = int(np.argmax(x))
    if case == "nan first":
        x[0 if best else 1] = np.nan
    elif case == "nan after max":
        x[best + 1 if best + 1 < x.size else best - 1] = np.nan
    elif case == "+inf":
        x[[5, 9]] = np.inf
    elif case == "-inf":
        x[best - 1 if best else best + 1] = -np.inf
    else:
        x[:] = -np.inf
        with pytest.raises(EvalError, match="no finite value"):
            Sampler()(x)
        return
    assert Sampler()(x) == int(np.argmax(np.where(np.isnan(x), -np.inf, x)))
    assert Sampler()(x) == (5 if case == "+inf" else best)


def test_repetition_penalty_changes_greedy_choice():
    x = np.array([0.0, 2.0, 1.9], np.float32)
    assert Sampler()(x, previous=[1]) == 1
    assert Sampler(SamplingOptions(repetition_penalty=1.2))(x, previous=[1]) == 2


def test_seed_reproduces_a_run():
    x = logits_of(2)
    opts = SamplingOptions(temperature=1.0, seed=123)
    s1, s2 = Sampler(opts), Sampler(opts)
    a = [s1(x) for _ in range(50)]
    b = [s2(x) for _ in range(50)]
    assert a == b
    c = [Sampler(SamplingOptions(temperature=1.0, seed=124))(x) for _ in range(50)]
    assert len(set(a)) > 1 and c != a


def test_samples_follow_the_softmax():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    s = Sampler(SamplingOptions(temperature=1.0, seed=0))
    counts = np.bincount([s(x) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.015)


def test_temperature_sharpens():
    x = np.log(np.array([0.6, 0.4]))
    s = Sampler(SamplingOptions(temperature=0.25, seed=0))
    share = np.mean([s(x) == 0 for _ in range(5000)])
    expected = 0.6**4 / (0.6**4 + 0.4**4)
    assert abs(share - expected) < 0.02


def test_top_k_and_top_p_restrict_the_support():
    x = logits_of(3)
    top5 = set(np.argsort(-x)[:5].tolist())
    s = Sampler(SamplingOptions(temperature=2.0, top_k=5, seed=0))
    assert {s(x) for _ in range(500)} <= top5
    s = Sampler(SamplingOptions(temperature=1.0, top_p=1e-6, seed=0))
    assert {s(x) for _ in range(50)} == {int(np.argmax(x))}


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_k": -1}, {"top_p": 0.0},
                                 {"top_p": 1.5}, {"repetition_penalty": 0.0}])
def test_invalid_options(bad):
    with pytest.raises(ValueError):
        SamplingOptions(**bad)
