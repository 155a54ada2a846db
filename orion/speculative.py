"""Speculative decoding: draft several tokens cheaply, check them in one eval of the
target model (`TransformerLM.verify`, K rows of the sequence), keep the longest prefix
the target agrees with, and one more token from the target itself.

    drafter = PromptLookup()                  # n-grams of the prompt and output so far
    drafter = DraftModel(small, target)       # a smaller model of the same tokenizer
    for token in speculative_tokens(model, logits, context, sampler, vocab, drafter, k):
        ...

Greedy: a draft is kept while it is the target's argmax (the output is plain greedy's,
token for token). Sampling: draft x, drawn from q, is kept with probability
min(1, p(x) / q(x)), p the target's distribution after the sampler's filters; at the
first rejection the token is drawn from normalize(max(0, p - q)), and after K kept
drafts from the target's next row, so every token is distributed as the target's
sampler would draw it (Leviathan et al. 2023, Chen et al. 2023). A drafter that
proposes tokens deterministically (prompt lookup, a greedy draft model) has q one-hot.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError
from orion.sample import Sampler, softmax

# ---- the rejection rule -----------------------------------------------------------------


def accept_or_resample(p: np.ndarray, q: np.ndarray | None, x: int,
                       rng: np.random.Generator) -> tuple[bool, int]:
    """One drafted position: (kept, token). `p` the target's probabilities, `q` the
    drafter's (None: x was proposed deterministically, q one-hot at x). Kept with
    probability min(1, p[x] / q[x]); else the token is drawn from max(0, p - q),
    normalized."""
    qx = 1.0 if q is None else float(q[x])
    if qx > 0 and rng.random() * qx < p[x]:
        return True, x
    residual = p.copy()
    if q is None:
        residual[x] = 0.0
    else:
        residual = np.maximum(residual - q, 0.0)
    total = residual.sum()
    if total <= 0:   # p == q: nothing to correct (a rejection of probability 0)
        residual, total = p, p.sum()
    return False, int(rng.choice(residual.size, p=residual / total))


def accepted_tokens(sampler: Sampler, rows: np.ndarray, drafts: Sequence[int],
                    qs: Sequence[np.ndarray] | None, context: Sequence[int]) -> list[int]:
    """The tokens a verify step yields: the kept drafts, then the target's own token
    (the correction at the first rejection, or the next after them all). `rows` are the
    target's logits [len(drafts) + 1, vocab]: row j after context + drafts[:j]."""
    out: list[int] = []
    history = list(context)
    for j, x in enumerate(drafts):
        logits = sampler.filtered_logits(rows[j], history)
        if sampler.options.greedy:
            best = int(np.argmax(logits))
            if best != x:
                return [*out, best]
        else:
            kept, token = accept_or_resample(softmax(logits), None if qs is None else qs[j],
                                             x, sampler.rng)
            if not kept:
                return [*out, token]
        out.append(x)
        history.append(x)
    return [*out, sampler(rows[len(drafts)], history)]


# ---- drafters ---------------------------------------------------------------------------


class PromptLookup:
    """Drafts by prompt lookup: the longest of the last `max_ngram` .. `min_ngram` ids
    that occurred earlier in the ids so far (prompt and output) proposes the tokens
    that followed its latest earlier occurrence. `adaptive`: a step verifies the
    drafts only while they have been right often enough to pay for the verify
    (`DraftPolicy`); else every proposal is verified."""

    name = "prompt"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, adaptive: bool = True) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidArgumentError(f"n-gram sizes must satisfy 1 <= min <= max, got "
                                       f"{min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.adaptive = adaptive

    def start(self, prompt: Sequence[int]) -> None:
        """Nothing to set up: each draft looks up the context it is handed."""

    def propose(self, context: Sequence[int], k: int, sampler: Sampler
                ) -> tuple[list[int], list[np.ndarray] | None]:
        ids = np.asarray(context, np.int64)
        n_ids = ids.size
        for n in range(min(self.max_ngram, n_ids - 1), self.min_ngram - 1, -1):
            tail = ids[n_ids - n:]
            windows = np.lib.stride_tricks.sliding_window_view(ids[: n_ids - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            hits = hits[hits + n < n_ids]
            if hits.size:
                start = int(hits[-1]) + n
                return [int(t) for t in ids[start: start + k]], None
        return [], None

    def rollback(self, keep: int) -> None:
        """Nothing to undo: prompt lookup keeps no state between steps."""


class DraftModel:
    """Drafts with a smaller model of the same tokenizer, decoding greedily (or
    sampled with the target's sampler options, its distribution q recorded); its
    cache follows the target's and is cut back (`truncate`) to the kept tokens."""

    name = "draft model"

    def __init__(self, draft: Any, target: Any) -> None:
        check_same_tokenizer(draft, target)
        self.model = draft
        # the ids the target's sampler picks from (`generate._sampled_ids`)
        self.vocab = min(int(target.config.vocab_size), int(target.tokenizer.vocab_size))

    def start(self, prompt: Sequence[int]) -> None:
        self.model.prefill(list(prompt))

    def propose(self, context: Sequence[int], k: int, sampler: Sampler
                ) -> tuple[list[int], list[np.ndarray] | None]:
        m = self.model
        k = min(k, m.max_length - len(context) + 1)   # room in the draft's context
        if k <= 0 or m.position > len(context) - 1:
            return [], None
        while m.position < len(context) - 1:          # what it has not seen yet
            m.decode(int(context[m.position]))
        logits = m.decode(int(context[-1]))[..., : self.vocab]
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        history = list(context)
        for i in range(k):
            x = sampler.filtered_logits(logits, history)
            if sampler.options.greedy:
                token = int(np.argmax(x))
            else:
                q = softmax(x)
                token = int(sampler.rng.choice(q.size, p=q))
                qs.append(q)
            drafts.append(token)
            history.append(token)
            if i < k - 1:
                logits = m.decode(token)[..., : self.vocab]
        return drafts, (qs if qs else None)

    def rollback(self, keep: int) -> None:
        if self.model.position > keep:
            self.model.truncate(keep)


PROBE_TEXTS = ("Hello, world!", " the quick brown fox", "1234 + 5678 = ", "\n\tdef f(x):")


def check_same_tokenizer(draft: Any, target: Any) -> None:
    """InvalidArgumentError unless the draft model reads the target's token ids: the
    same vocabulary size, end-of-text ids and encodings of a few texts."""
    dv, tv = int(draft.config.vocab_size), int(target.config.vocab_size)
    if dv != tv:
        raise InvalidArgumentError(f"the draft model's vocabulary has {dv} rows and the "
                                   f"target's {tv}: a draft model must share the target's "
                                   f"tokenizer")
    dt, tt = draft.tokenizer, target.tokenizer
    if int(dt.vocab_size) != int(tt.vocab_size) or dt.eos_token_id != tt.eos_token_id:
        raise InvalidArgumentError(f"the draft model's tokenizer ({dt.vocab_size} ids, "
                                   f"end-of-text {dt.eos_token_id}) is not the target's "
                                   f"({tt.vocab_size} ids, end-of-text {tt.eos_token_id})")
    for text in PROBE_TEXTS:
        a, b = list(dt.encode(text)), list(tt.encode(text))
        if a != b:
            raise InvalidArgumentError(f"the draft model's tokenizer encodes {text!r} as "
                                       f"{a[:8]} and the target's as {b[:8]}: a draft model "
                                       f"must share the target's tokenizer")


# ---- when drafts pay ---------------------------------------------------------------------


def verify_cost(backend: str, rows: int) -> float:
    """A verify of `rows` rows (a bucket), in decode steps. The ANE computes the
    columns a surface pads to anyway (ANE-C24; 5 drafts verified for ~1.05 a token on
    an 8B model, sbryngelson/ANEForge#49). vane reads each weight once for the rows but
    does every row's arithmetic: GPT-2 small's verify of 8 rows cost 2.2 decode steps
    and of 16 rows 3.0 (docs/generate.md), about 1 + rows / 8."""
    return 1.05 if backend == "ane" else 1.0 + rows / 8.0


class DraftPolicy:
    """Whether a step verifies prompt lookup's drafts: the expected tokens of a verify
    of d drafts, 1 + a + ... + a^d for a draft kept with probability a, against the
    verify's cost in decode steps (`cost`: its bucket's, which it pays whatever d is);
    a plain decode step yields 1 token for 1. `a` is kept / (kept + missed) over recent
    drafts, each observation weighted `decay` times the one after it. A plain step
    still observes: its token is or is not the first draft it declined. Decisions
    depend on the tokens alone (no timing), so a seeded run repeats."""

    def __init__(self, cost: float, kept: float = 3.0, missed: float = 1.0,
                 decay: float = 0.9) -> None:
        self.cost = cost
        self.kept, self.missed, self.decay = kept, missed, decay   # starts at a = 0.75

    @property
    def acceptance(self) -> float:
        return self.kept / (self.kept + self.missed)

    def expected_tokens(self, drafts: int) -> float:
        a = self.acceptance
        return float(drafts + 1) if a >= 1.0 else (1.0 - a ** (drafts + 1)) / (1.0 - a)

    def worth_verifying(self, drafts: int) -> bool:
        return self.expected_tokens(drafts) > self.cost

    def observe(self, drafted: int, kept: int) -> None:
        """A verify (or a plain step's one draft) kept `kept` of `drafted` drafts."""
        self.kept = self.kept * self.decay + kept
        self.missed = self.missed * self.decay + (1 if kept < drafted else 0)


# ---- the loop ---------------------------------------------------------------------------


@dataclass
class SpeculationStats:
    """drafted: tokens drafted; accepted: drafts the target kept; verify_steps: verify
    steps (one eval of each of the target's programs); decode_steps: plain decode
    steps (no draft proposed, or no room for one); tokens: what the steps produced.
    `tokens_per_step` is tokens per target step (the drafter's evals not counted)."""

    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    decode_steps: int = 0
    tokens: int = 0   # tokens the steps produced (kept drafts + the target's own)
    declined: int = 0   # plain steps taken though drafts were proposed (`DraftPolicy`)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        steps = self.verify_steps + self.decode_steps
        return self.tokens / steps if steps else 0.0


def _plain_step(model: Any, context: list[int], sampler: Sampler, vocab: int,
                stats: SpeculationStats, timed: Any) -> Iterator[int]:
    """One decode step: yields its token, and returns it."""
    logits = timed(model.decode, context[-1])
    stats.decode_steps += 1
    stats.tokens += 1
    token = sampler(logits[..., :vocab], context)
    yield token
    return token


def speculative_tokens(model: Any, logits: np.ndarray, context: list[int],
                       sampler: Sampler, vocab: int, drafter: Any, k: int,
                       stats: SpeculationStats, timed: Any) -> Iterator[int]:
    """The generated tokens, one at a time, after prefill `logits`. The caller appends
    each yielded token to `context` before asking for the next (as the plain loop
    does); `timed(fn, *args)` runs a device call (the drafter's, the model's) and
    counts its time."""
    policy = None
    if getattr(drafter, "adaptive", False) and k > 0:
        from orion.models.plan import verify_rows

        # k drafts' bucket: the one planned, which a verify of fewer pads to
        policy = DraftPolicy(verify_cost(str(getattr(model, "backend", "vane")),
                                         verify_rows(1 + k)))
    # a batch slot (orion.serve.batching) verifies only while no other request decodes
    verify_pays = getattr(model, "verify_pays", None)
    yield sampler(logits[..., :vocab], context)
    while True:
        if verify_pays is not None and not verify_pays():
            yield from _plain_step(model, context, sampler, vocab, stats, timed)
            continue
        pos = len(context) - 1      # the last token is not in the cache yet
        room = model.max_length - pos - 1     # drafts after it that fit the context
        drafts, qs = timed(drafter.propose, context, min(k, room), sampler) \
            if room > 0 and k > 0 else ([], None)
        if qs is None and drafts and not all(0 <= t < vocab for t in drafts):
            drafts = list(itertools.takewhile(lambda t: 0 <= t < vocab, drafts))
        if policy is not None and drafts and not policy.worth_verifying(len(drafts)):
            # a plain step, whose token says whether the first draft was right
            stats.declined += 1
            token = yield from _plain_step(model, context, sampler, vocab, stats, timed)
            policy.observe(1, int(token == drafts[0]))
            continue
        if not drafts:
            yield from _plain_step(model, context, sampler, vocab, stats, timed)
            continue
        rows = timed(model.verify, [context[-1], *drafts])[:, :vocab]
        if len(rows) <= len(drafts):   # a batch slot ran fewer rows (its model was busy)
            drafts = drafts[: len(rows) - 1]
            qs = None if qs is None else qs[: len(drafts)]
        out = accepted_tokens(sampler, rows, drafts, qs, context)
        kept = len(out) - 1
        model.truncate(pos + 1 + kept)
        drafter.rollback(pos + 1 + kept)
        if not drafts:   # the one row ran as a decode step
            stats.decode_steps += 1
        else:
            stats.verify_steps += 1
            if policy is not None:
                policy.observe(len(drafts), kept)
        stats.drafted += len(drafts)
        stats.accepted += kept
        stats.tokens += len(out)
        yield from out
