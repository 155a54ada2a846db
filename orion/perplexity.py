"""Perplexity of a model on a text, in strided windows: Hugging Face's perplexity guide
("Perplexity of fixed-length models") and llama.cpp's llama-perplexity.

The text's token ids are read in windows of `context` tokens whose starts are `stride`
apart. Each window is one prefill with the logits of every position
(`model.prefill(ids, all_logits=True)`), and scores only the tokens after the previous
window's end, each predicted from everything before it in the window: every token but
the first is scored once, and with stride < context each has at least
context - stride tokens of history (llama-perplexity's default, stride = context / 2,
scores each window's second half). A window's first token is never scored (nothing
in the window precedes it), so with stride = context the windows' first tokens are
not, as in the guide.

    perplexity = exp(mean over scored tokens of -log p(token | its history))

The log-softmax runs in float64 on the model's fp32 logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orion.errors import InvalidArgumentError
from orion.models.base import CausalLM, check_token_ids

ROWS = 64   # logits rows turned into log-probabilities at once: bounds the temporaries


@dataclass(frozen=True)
class Window:
    """Tokens [begin, end) run as one prefill; those in [scored_from, end) are scored."""

    begin: int
    end: int
    scored_from: int


@dataclass
class PerplexityResult:
    """perplexity:  exp(nll)
    nll:         mean negative log-likelihood per scored token, in nats
    stderr:      standard error of the perplexity (the delta method on the per-token
                 NLLs, as llama-perplexity reports its "+/-")
    tokens:      tokens scored; windows, context, stride: how they were read"""

    perplexity: float
    nll: float
    stderr: float
    tokens: int
    windows: int
    context: int
    stride: int

    def summary(self) -> str:
        return (f"perplexity {self.perplexity:.4f} +/- {self.stderr:.4f} (mean NLL "
                f"{self.nll:.4f} nats over {self.tokens:,} tokens; {self.windows} "
                f"window{'s' if self.windows != 1 else ''} of {self.context} tokens, "
                f"stride {self.stride})")


def windows(n_tokens: int, context: int, stride: int) -> list[Window]:
    """The windows over `n_tokens` tokens, as the guide's loop makes them."""
    if not 1 <= stride <= context:
        raise InvalidArgumentError(f"the stride must be in [1, context {context}], "
                                   f"got {stride}")
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        out.append(Window(begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n_tokens:
            break
    return out


def largest_window(model: CausalLM) -> int:
    """The longest window one all-logits prefill takes: the model's largest prefill
    bucket (a longer prompt runs as decode steps, which give only the last logits),
    within its context."""
    return min(max(model.prefill_buckets), model.max_length)


def token_nlls(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] for each row, in float64."""
    out = np.empty(len(targets), np.float64)
    for start in range(0, len(targets), ROWS):
        rows = logits[start:start + ROWS].astype(np.float64)
        peak = rows.max(axis=1, keepdims=True)
        log_z = peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))
        picked = rows[np.arange(len(rows)), np.asarray(targets[start:start + ROWS])]
        out[start:start + len(rows)] = log_z - picked
    return out


def perplexity(model: CausalLM, ids: Sequence[int], *, context: int | None = None,
               stride: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
    """The perplexity of `model` on token ids `ids` (see the module docstring).
    context: window length (default and most: `largest_window(model)`); stride: the
    distance between window starts (default context // 2). `progress(done, total)` is
    called after each window."""
    ids = check_token_ids(ids, int(model.config.vocab_size))
    most = largest_window(model)
    context = most if context is None else context
    if not 2 <= context <= most:
        raise InvalidArgumentError(f"the window must be 2 to {most} tokens for this model "
                                   f"(its largest all-logits prefill), got {context}")
    stride = max(1, context // 2) if stride is None else stride
    if len(ids) < 2:
        raise InvalidArgumentError(f"perplexity needs a text of at least 2 tokens, got "
                                   f"{len(ids)}")
    plan = windows(len(ids), context, stride)
    nlls = []
    for done, w in enumerate(plan, 1):
        logits = model.prefill(ids[w.begin:w.end], all_logits=True)
        # row r predicts token begin + r + 1
        rows = slice(w.scored_from - 1 - w.begin, w.end - 1 - w.begin)
        nlls.append(token_nlls(logits[rows], ids[w.scored_from:w.end]))
        if progress is not None:
            progress(done, len(plan))
    model.reset()
    every = np.concatenate(nlls)
    nll = float(every.mean())
    ppl = math.exp(nll)
    spread = float(every.std(ddof=1)) if len(every) > 1 else 0.0
    return PerplexityResult(ppl, nll, ppl * spread / math.sqrt(len(every)), len(every),
                            len(plan), context, stride)
