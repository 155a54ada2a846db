"""orion.speculative: the rejection rule keeps the target's distribution (a chi-square
test that a wrong rule fails), prompt lookup's drafts, the draft model's checks, and
speculative generation giving plain greedy's tokens (GPT-2, a Qwen3 shape) with stops,
max_tokens and the context's end where they fall without speculation."""

from __future__ import annotations

import numpy as np
import pytest
from copying_task import copying_prompt, save_peaked_tiny_gpt2, tokens

from orion.errors import InvalidArgumentError
from orion.sample import Sampler, SamplingOptions
from orion.speculative import (
    DraftPolicy,
    PromptLookup,
    accept_or_resample,
    accepted_tokens,
    verify_cost,
)

# chi-square critical value at p = 0.001 for 5 degrees of freedom (6 outcomes)
CHI2_5_AT_0_001 = 20.515
P = np.array([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
Q = np.array([0.30, 0.05, 0.25, 0.10, 0.10, 0.20])
DRAWS = 20_000


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    want = counts.sum() * probs
    return float(((counts - want) ** 2 / want).sum())


def draw(rule, q: np.ndarray | None, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(P.size)
    for _ in range(DRAWS):
        x = int(rng.choice(P.size, p=Q)) if q is not None else 2
        counts[rule(P, q, x, rng)[1]] += 1
    return counts


def always_accept(p, q, x, rng):
    return True, x


def accept_without_residual(p, q, x, rng):   # the right test, a wrong correction
    qx = 1.0 if q is None else q[x]
    if rng.random() * qx < p[x]:
        return True, x
    return False, int(rng.choice(p.size, p=p))


@pytest.mark.parametrize("q", [Q, None], ids=["sampled-draft", "one-hot-draft"])
def test_rejection_rule_keeps_the_target_distribution(q):
    assert chi_square(draw(accept_or_resample, q), P) < CHI2_5_AT_0_001
    # and wrong rules fail the same test
    assert chi_square(draw(always_accept, q), P) > 10 * CHI2_5_AT_0_001
    assert chi_square(draw(accept_without_residual, q), P) > CHI2_5_AT_0_001


def test_each_token_of_a_verify_step_follows_the_target():
    """Two drafted positions: the step's first token is distributed as row 0, and the
    second, given the first was the draft, as row 1."""
    sampler = Sampler(SamplingOptions(temperature=1.0, seed=3))
    rows = np.log(np.stack([P, P[::-1], Q]))
    first, second = np.zeros(P.size), np.zeros(P.size)
    for _ in range(DRAWS):
        out = accepted_tokens(sampler, rows, [1, 4], None, [0])
        first[out[0]] += 1
        if out[0] == 1:
            second[out[1]] += 1
    assert chi_square(first, P) < CHI2_5_AT_0_001
    assert chi_square(second, P[::-1]) < CHI2_5_AT_0_001


def test_greedy_keeps_drafts_while_they_are_the_argmax():
    sampler = Sampler(SamplingOptions())
    rows = np.eye(6)[[1, 4, 2, 5]] * 3.0
    assert accepted_tokens(sampler, rows, [1, 4, 2], None, []) == [1, 4, 2, 5]
    assert accepted_tokens(sampler, rows, [1, 3, 2], None, []) == [1, 4]
    assert accepted_tokens(sampler, rows, [0, 4, 2], None, []) == [1]


def test_prompt_lookup_proposes_what_followed_the_longest_recent_ngram():
    look = PromptLookup()
    s = Sampler()
    ids = [5, 6, 7, 8, 9, 1, 6, 7, 3, 4, 9, 5, 6, 7]
    assert look.propose(ids, 3, s) == ([8, 9, 1], None)   # "5 6 7" was followed by 8 9 1,
    # "6 7" latest by 3 4 9: the longer n-gram wins
    assert look.propose(ids[:-3] + [2, 6, 7], 3, s) == ([3, 4, 9], None)   # the latest "6 7"
    assert look.propose([1, 2, 3, 1, 2], 8, s)[0] == [3, 1, 2]
    assert look.propose([1, 2, 3, 4], 4, s) == ([], None)
    assert look.propose([7], 4, s) == ([], None)
    with pytest.raises(InvalidArgumentError):
        PromptLookup(max_ngram=0)


class _Tok:
    def __init__(self, vocab, eos=0, shift=0):
        self.vocab_size, self.eos_token_id, self.shift = vocab, eos, shift

    def encode(self, text):
        return [ord(c) + self.shift for c in text]


class _Model:
    def __init__(self, vocab, tok):
        from types import SimpleNamespace

        self.config, self.tokenizer = SimpleNamespace(vocab_size=vocab), tok


def test_the_draft_policy_verifies_while_drafts_pay_and_declines_after_misses():
    policy = DraftPolicy(verify_cost("vane", 8))          # a verify of 8 rows: 2 steps
    assert policy.cost == 2.0 and policy.acceptance == 0.75
    assert policy.worth_verifying(7) and not policy.worth_verifying(1)
    for _ in range(4):                                    # four verifies missing at once
        policy.observe(7, 0)
    assert policy.acceptance < 0.35 and not policy.worth_verifying(7)
    policy.observe(1, 1)                                  # a declined draft found right
    assert not policy.worth_verifying(7)
    for _ in range(2):
        policy.observe(1, 1)
    assert policy.acceptance > 0.55 and policy.worth_verifying(7)
    # the ANE pays for the padded columns anyway: a fair chance of one kept draft pays
    ane = DraftPolicy(verify_cost("ane", 8), kept=1.0, missed=3.0)
    assert ane.worth_verifying(3) and not DraftPolicy(2.0, kept=1.0, missed=3.0) \
        .worth_verifying(31)
    assert policy.expected_tokens(0) == 1.0
    assert DraftPolicy(2.0, kept=1.0, missed=0.0).expected_tokens(7) == 8.0


def test_a_draft_model_of_another_tokenizer_is_refused():
    from orion.speculative import DraftModel

    target = _Model(300, _Tok(300))
    with pytest.raises(InvalidArgumentError, match="draft model's vocabulary has 200 rows"):
        DraftModel(_Model(200, _Tok(200)), target)
    with pytest.raises(InvalidArgumentError, match="end-of-text"):
        DraftModel(_Model(300, _Tok(300, eos=1)), target)
    with pytest.raises(InvalidArgumentError, match="encodes 'Hello, world!'"):
        DraftModel(_Model(300, _Tok(300, shift=1)), target)
    DraftModel(_Model(300, _Tok(300)), target)


# ---- generation on the backend --------------------------------------------------------


@pytest.fixture(scope="module")
def budget():
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)
    yield
    set_compile_budget(old)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_peaked_tiny_gpt2(tmp_path_factory.mktemp("gpt2") / "g")


@pytest.fixture(scope="module")
def gpt2(gpt2_dir, budget):
    from orion.models import load_model

    m = load_model(gpt2_dir, prefill_buckets=(32, 64), decode_buckets=(32, 64, 128))
    yield m
    m.close()


@pytest.mark.native
def test_greedy_speculative_output_is_plain_greedy_gpt2(gpt2):
    copying = copying_prompt(gpt2)          # 44 tokens: the output crosses bucket 64
    fresh = [int(i) for i in np.random.default_rng(9).integers(0, 2048, 20)]
    for prompt in (copying, fresh):
        plain, _ = tokens(gpt2, prompt, max_tokens=60)
        spec, stats = tokens(gpt2, prompt, max_tokens=60, speculative="prompt")
        assert spec == plain
        assert stats.decode_steps == stats.speculation.tokens
    _, stats = tokens(gpt2, copying, max_tokens=60, speculative="prompt")
    s = stats.speculation
    assert s.verify_steps >= 3 and s.accepted >= 20 and s.tokens_per_step > 1.3


@pytest.mark.native
def test_prompt_lookup_declines_drafts_that_keep_missing(gpt2):
    """A prompt holding the peaked GPT-2's greedy chain c1, c2, ... from c0, each link
    followed by a wrong id (c1, x1, c2, x2, ..., then c0): after each c_i the output
    gives, lookup drafts x_i, which the target never keeps. Verifying each costs a
    verify a token; the default stops after a few, with the same tokens."""
    c0 = 5
    chain = tokens(gpt2, [c0], max_tokens=30)[0]
    wrong = [(c + 1000) % 2048 for c in chain]
    prompt = [t for pair in zip(chain, wrong, strict=True) for t in pair] + [c0]
    plain, _ = tokens(gpt2, prompt, max_tokens=40)
    always, a = tokens(gpt2, prompt, max_tokens=40, speculative=PromptLookup(adaptive=False))
    adaptive, b = tokens(gpt2, prompt, max_tokens=40, speculative="prompt")
    assert always == plain and adaptive == plain
    assert a.speculation.acceptance < 0.2 and a.speculation.declined == 0
    assert b.speculation.declined > 20
    assert b.speculation.verify_steps < a.speculation.verify_steps / 2


@pytest.mark.native
def test_stops_max_tokens_and_the_context_fall_where_plain_decoding_puts_them(gpt2):
    from orion.generate import generate

    prompt = copying_prompt(gpt2)
    for n in (1, 5, 13):
        assert tokens(gpt2, prompt, max_tokens=n, speculative="prompt")[0] == \
            tokens(gpt2, prompt, max_tokens=n)[0]
    text = generate(gpt2, prompt, max_tokens=40, stop_at_eos=False)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    want = generate(gpt2, prompt, max_tokens=40, stop=stop, stop_at_eos=False)
    assert generate(gpt2, prompt, max_tokens=40, stop=stop, stop_at_eos=False,
                    speculative="prompt") == want
    # 120 tokens of context left 8: drafts of 7 never pass it
    near = (prompt * 3)[:120]
    plain, _ = tokens(gpt2, near, max_tokens=50)
    spec, sstats = tokens(gpt2, near, max_tokens=50, speculative="prompt", draft_tokens=15)
    assert spec == plain and len(spec) == 9 and sstats.cut_at_context


@pytest.mark.native
def test_sampled_speculation_repeats_with_a_seed(gpt2):
    prompt = copying_prompt(gpt2)
    a = tokens(gpt2, prompt, max_tokens=30, temperature=0.8, seed=5, speculative="prompt")
    b = tokens(gpt2, prompt, max_tokens=30, temperature=0.8, seed=5, speculative="prompt")
    assert a[0] == b[0] and len(a[0]) == 30


@pytest.mark.native
def test_the_model_as_its_own_draft(gpt2, gpt2_dir):
    from orion.models import load_model

    draft = load_model(gpt2_dir, prefill_buckets=(32, 64), decode_buckets=(32, 64, 128))
    try:
        prompt = [int(i) for i in np.random.default_rng(4).integers(0, 2048, 20)]
        plain, _ = tokens(gpt2, prompt, max_tokens=40)
        spec, stats = tokens(gpt2, prompt, max_tokens=40, speculative=draft)
        assert spec == plain
        assert stats.speculation.acceptance > 0.9
        # sampled: the draft's q is recorded and the rule applied (the distribution is
        # test_rejection_rule_keeps_the_target_distribution's)
        sampled, stats = tokens(gpt2, prompt, max_tokens=20, temperature=1.0, seed=1,
                                speculative=draft)
        assert len(sampled) == 20 and stats.speculation.verify_steps >= 1
    finally:
        draft.close()


@pytest.mark.native
def test_bad_speculation_options_are_refused(gpt2, gpt2_dir, tmp_path):
    from models.conftest import TINY, save_peaked_gpt2

    from orion.models import load_model

    with pytest.raises(InvalidArgumentError, match="draft_tokens"):
        tokens(gpt2, [1, 2], max_tokens=2, speculative="prompt", draft_tokens=32)
    with pytest.raises(InvalidArgumentError, match="speculative must be"):
        tokens(gpt2, [1, 2], max_tokens=2, speculative="lookahead")
    other = load_model(save_peaked_gpt2(tmp_path / "o", dict(TINY, vocab_size=1024)),
                       prefill_buckets=(32,), decode_buckets=(32,))
    try:
        with pytest.raises(InvalidArgumentError, match="1024 rows and the target's 2048"):
            tokens(gpt2, [1, 2], max_tokens=2, speculative=other)
    finally:
        other.close()


@pytest.mark.native
def test_greedy_speculative_output_is_plain_greedy_qwen3(tmp_path_factory, gpt2):
    from models.hf_fixtures import PUBLISHED, SHRINK, save_numpy_init

    from orion.models import load_model

    config = dict(PUBLISHED["Qwen3-0.6B"], **SHRINK["Qwen3-0.6B"], vocab_size=4096)
    folder = save_numpy_init(tmp_path_factory.mktemp("qwen3") / "q", config)
    m = load_model(folder, prefill_buckets=(32,), decode_buckets=(32, 64))
    m.tokenizer = gpt2.tokenizer   # the folder has none; ids < 4096 decode with GPT-2's
    try:
        start = [int(i) for i in np.random.default_rng(2).integers(0, 4096, 8)]
        prompt = start * 3      # a repeating prompt: lookup drafts its next period
        plain, _ = tokens(m, prompt, max_tokens=30)
        # every draft verified (random weights rarely follow the period: the adaptive
        # default soon declines them), then the default
        spec, stats = tokens(m, prompt, max_tokens=30,
                             speculative=PromptLookup(adaptive=False))
        assert spec == plain and stats.speculation.verify_steps >= 1
        assert tokens(m, prompt, max_tokens=30, speculative="prompt")[0] == plain
    finally:
        m.close()


def test_the_cli_defaults_are_the_apis():
    from orion.cli import speculative
    from orion.generate import DRAFT_TOKENS, DRAFT_TOKENS_MAX

    assert (speculative.DRAFT_TOKENS, speculative.DRAFT_TOKENS_MAX) == \
        (DRAFT_TOKENS, DRAFT_TOKENS_MAX)
