"""`orion bench [--model M] [-p 128] [-n 128] [-t 128] [-r 5] [-o md|json]`: prefill and
decode tokens/s and a training step, as llama-bench measures and prints them
(orion.bench), saying on stderr what it runs and how far along it is. The defaults
take seconds on two cores with the shipped model."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path


def _counts(text: str) -> list[int]:
    """llama-bench's comma-separated lists: "-p 32,128"."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give token counts separated by "
                                         "commas, e.g. 32,128") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="measure prefill and decode tokens/s and a training step",
        description="llama-bench's measurements on Orion: ppN is one prefill of N random "
        "tokens, tgN N decode steps after a one-token prompt (no sampling), trainN one "
        "`orion train` optimizer step on one N-token sequence of the model's shape (a model "
        "folder with a SentencePiece tokenizer.model). Each test warms up once (compiles "
        "are timed apart, on stderr), then runs -r times; the table shows the mean tokens "
        "per second and its standard deviation. Progress goes to stderr.")
    p.add_argument("--model", "-m", default=None,
                   help="model folder, file or repo id (default: the shipped Shakespeare "
                   "Llama)")
    p.add_argument("-p", "--n-prompt", type=_counts, default=[128], metavar="N[,N...]",
                   help="prompt lengths to prefill (128; 0: none)")
    p.add_argument("-n", "--n-gen", type=_counts, default=[128], metavar="N[,N...]",
                   help="tokens to generate (128; 0: none)")
    p.add_argument("-t", "--n-train", type=_counts, default=None, metavar="N[,N...]",
                   help="sequence lengths of a training step, batch 1 (128 where orion "
                   "train can train the model, else none; 0: none)")
    p.add_argument("-r", "--repetitions", type=int, default=5,
                   help="timed runs of each test, after one warm-up (5)")
    p.add_argument("-o", "--output", choices=["md", "json"], default="md",
                   help="a markdown table (md, default) or llama-bench's JSON")
    p.add_argument("--json", dest="output", action="store_const", const="json",
                   help="the same as -o json")
    p.add_argument("--threads", type=int, default=None,
                   help="vane's CPU threads (default: its own choice)")
    p.add_argument("--backend", default=None, help="vane, ane or auto (default: the best)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orion
    from orion.bench import (
        bench_decode,
        bench_prefill,
        bench_train,
        check_counts,
        table,
        train_refusal,
    )
    from orion.errors import InvalidArgumentError
    from orion.runtime import num_threads, set_num_threads

    if args.repetitions < 1:
        raise InvalidArgumentError(f"-r {args.repetitions}: give at least 1 repetition")
    prompts = check_counts(args.n_prompt, "-p")
    gens = check_counts(args.n_gen, "-n")
    trains = check_counts(args.n_train or [128], "-t")
    if args.threads is not None:
        if args.threads < 1:
            raise InvalidArgumentError(f"--threads {args.threads}: give at least 1")
        set_num_threads(args.threads)
    if args.model is None:
        from orion.models.registry import default_model_path

        args.model = str(default_model_path())
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"orion bench: [{time.perf_counter() - started:5.1f} s] {message}",
              file=sys.stderr, flush=True)

    progress(f"loading {args.model}")
    model, _ = orion.load(args.model, backend=args.backend)
    rows = []
    try:
        why = train_refusal(Path(args.model)) if trains else None
        if why is not None:
            if args.n_train is not None:   # asked for: an error; the default: a note
                raise InvalidArgumentError(f"-t: cannot bench a training step: {why}")
            progress(f"no training step: {why}")
            trains = []
        for n in prompts:
            rows.append(bench_prefill(model, n, args.repetitions, progress))
        for n in gens:
            rows.append(bench_decode(model, n, args.repetitions, progress))
        for n in trains:
            rows.append(bench_train(model, Path(args.model), n, args.repetitions, progress))
        # the size `print(model)` states ("<GPT2 GPT-2, 124.4M parameters (...")
        size = re.search(r"([\d.]+[KMGT]?) parameters", repr(model))
        params = size.group(1) if size else "?"
        backend = model.backend
    finally:
        model.close()
    name = Path(args.model.rstrip("/")).name or args.model
    if args.output == "json":
        print(json.dumps([{"model": name, "params": params, "backend": backend,
                           "n_threads": num_threads(), **r.to_json()} for r in rows],
                         indent=2))
    else:
        print(table(rows, name, params, backend, num_threads()))
    progress("done")
    return 0
