"""`orion bench`'s measurements, in llama-bench's shape: prompt processing (ppN: one
prefill of N random tokens), text generation (tgN: N decode steps from a one-token
context, one random token each, no sampling) and a training step (trainN: one
optimizer step of `orion train` on a batch of one N-token sequence, the model's shape
with fresh weights). Each test runs once to warm up (compiles happen there, timed
apart) and then `repetitions` times; tokens per second are the tokens of a run over
its wall time.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError
from orion.models.base import CausalLM

Progress = Callable[[str], None]
SEED = 0   # of the random tokens: every run measures the same work


@dataclass
class BenchResult:
    """One test's runs. test: "pp128", "tg128", "train128"; tokens: per run."""

    test: str
    n_prompt: int
    n_gen: int
    n_train: int
    tokens: int
    warmup_ns: int
    samples_ns: list[int] = field(default_factory=list)

    @property
    def samples_ts(self) -> list[float]:
        return [self.tokens * 1e9 / ns for ns in self.samples_ns]

    @property
    def avg_ts(self) -> float:
        return float(np.mean(self.samples_ts))

    @property
    def stddev_ts(self) -> float:
        return float(np.std(self.samples_ts, ddof=1)) if len(self.samples_ns) > 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        """llama-bench's JSON fields for a test (-o json), plus the warm-up's time."""
        ns = np.asarray(self.samples_ns, np.float64)
        return {"test": self.test, "n_prompt": self.n_prompt, "n_gen": self.n_gen,
                "n_train": self.n_train, "warmup_ns": self.warmup_ns,
                "avg_ns": int(ns.mean()),
                "stddev_ns": int(ns.std(ddof=1)) if len(ns) > 1 else 0,
                "avg_ts": self.avg_ts, "stddev_ts": self.stddev_ts,
                "samples_ns": list(self.samples_ns), "samples_ts": self.samples_ts}


def _vocab(model: CausalLM) -> int:
    return int(model.config.vocab_size)


def _runs(result: BenchResult, repetitions: int, once: Callable[[], int],
          progress: Progress, warmup: str = "warm-up run (compiles its programs)"
          ) -> BenchResult:
    """Warm-up, then `repetitions` timed runs of `once` (which returns its ns)."""
    progress(f"{result.test}: {warmup}")
    result.warmup_ns = once()
    for r in range(1, repetitions + 1):
        result.samples_ns.append(once())
        progress(f"{result.test}: run {r}/{repetitions}: "
                 f"{result.samples_ts[-1]:,.1f} tokens/s")
    return result


def bench_prefill(model: CausalLM, n: int, repetitions: int,
                  progress: Progress = lambda _: None) -> BenchResult:
    """ppN: one prefill of N random tokens."""
    if not 1 <= n <= model.max_length:
        raise InvalidArgumentError(f"-p {n}: a prompt must be 1 to {model.max_length} tokens "
                                   "(the model's context)")
    ids = [int(i) for i in np.random.default_rng(SEED).integers(0, _vocab(model), n)]

    def once() -> int:
        t = time.perf_counter_ns()
        model.prefill(ids)
        return time.perf_counter_ns() - t

    return _runs(BenchResult(f"pp{n}", n, 0, 0, n, 0), repetitions, once, progress)


def bench_decode(model: CausalLM, n: int, repetitions: int,
                 progress: Progress = lambda _: None) -> BenchResult:
    """tgN: N decode steps after a one-token prefill (not timed)."""
    if not 1 <= n < model.max_length:
        raise InvalidArgumentError(f"-n {n}: generation must be 1 to {model.max_length - 1} "
                                   "tokens (the model's context after one token)")
    tokens = [int(i) for i in np.random.default_rng(SEED).integers(0, _vocab(model), n + 1)]

    def once() -> int:
        model.prefill(tokens[:1])
        t = time.perf_counter_ns()
        for token in tokens[1:]:
            model.decode(token)
        return time.perf_counter_ns() - t

    return _runs(BenchResult(f"tg{n}", 0, n, 0, n, 0), repetitions, once, progress)


def train_refusal(folder: Path) -> str | None:
    """Why `orion train` cannot train the model of `folder`, or None when it can: it
    trains what a config.json describes, with a SentencePiece tokenizer."""
    if not (folder / "config.json").is_file():
        return "orion train needs a Hugging Face model folder (config.json)"
    if not (folder / "tokenizer.model").is_file():
        return ("orion train needs a SentencePiece tokenizer.model, which the model's folder "
                "lacks")
    return None


def bench_train(model: CausalLM, folder: Path, seq: int, repetitions: int,
                progress: Progress = lambda _: None) -> BenchResult:
    """trainN: `orion.train.Trainer` steps on the folder's config.json (fresh weights,
    the folder's tokenizer), batch 1, N tokens, in a temporary run folder."""
    from orion.models.registry import read_config_json
    from orion.train.config import TrainConfig
    from orion.train.trainer import Trainer

    why = train_refusal(folder)
    if why is not None:
        raise InvalidArgumentError(f"cannot bench a training step: {why}")
    if not 1 <= seq <= model.max_length:
        raise InvalidArgumentError(f"-t {seq}: a training sequence must be 1 to "
                                   f"{model.max_length} tokens")
    config = TrainConfig(model=read_config_json(folder),
                         tokenizer=str(folder / "tokenizer.model"), batch_size=1,
                         seq_len=seq, steps=1_000_000, warmup=0, checkpoint_every=0,
                         val_fraction=0.0, seed=SEED)
    scratch = Path(tempfile.mkdtemp(prefix="orion-bench-"))
    try:
        # a corpus of random tokens, as text, enough for every step's batch
        need = (seq + 1) * (repetitions + 2) * 2
        ids = np.random.default_rng(SEED).integers(0, _vocab(model), need)
        text = model.tokenizer.decode([int(i) for i in ids])
        (scratch / "corpus.txt").write_text(text, encoding="utf-8")
        progress(f"train{seq}: compiling the training programs")
        trainer = Trainer(config, scratch / "corpus.txt", scratch / "run", progress=False)
        try:
            def once() -> int:
                t = time.perf_counter_ns()
                trainer.train_step()
                return time.perf_counter_ns() - t

            result = BenchResult(f"train{seq}", 0, 0, seq, seq, 0)
            return _runs(result, repetitions, once, progress, "warm-up step")
        finally:
            trainer.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def table(rows: list[BenchResult], model: str, params: str, backend: str,
          threads: int) -> str:
    """llama-bench's markdown table."""
    head = ["model", "params", "backend", "threads", "test", "t/s"]
    body = [[model, params, backend, str(threads), r.test,
             f"{r.avg_ts:,.2f} ± {r.stddev_ts:,.2f}"] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    right = {"params", "threads", "t/s"}

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if h in right else c.ljust(w)
                                 for c, w, h in zip(cells, widths, head, strict=True)) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if h in right else "-" * w
                             for w, h in zip(widths, head, strict=True)) + " |"
    return "\n".join([line(head), rule, *map(line, body)])


def check_counts(values: list[int], flag: str) -> list[int]:
    """-p / -n / -t values: each >= 0; 0 skips the test."""
    for v in values:
        if v < 0:
            raise InvalidArgumentError(f"{flag} {v}: token counts must be >= 0")
    return [v for v in values if v]
