"""`orion train --config CONFIG --data FILE --out DIR [--resume]`: a thin caller of
`orion.train.Trainer` (progress bar, JSONL log, loss PNG and checkpoints are the
library's)."""

from __future__ import annotations

import argparse
import json
import sys

from orion.cli.options import integer


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train a Llama model on a text corpus",
        description="Train a Llama model: forward/backward programs on the backend, loss, "
        "weight gradients and AdamW on the CPU, weights updated by delta reload or as "
        "program inputs. Writes into the --out folder OUT: checkpoint.safetensors, the model "
        "as a Hugging Face folder (config.json, model.safetensors, tokenizer.model: run it "
        "with `orion generate --model OUT \"prompt\"`), log.jsonl and loss.png.")
    p.add_argument("--config", required=True, help="training config (JSON, see docs/training.md)")
    p.add_argument("--data", required=True, help="UTF-8 text corpus")
    p.add_argument("--out", required=True, metavar="OUT",
                   help="output folder (the run's files and the trained model)")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.safetensors")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in an OUT that holds a run (its run files are replaced)")
    p.add_argument("--steps", type=integer(0), default=None,
                   help="train this many more steps (also past the config's steps, at min_lr)")
    p.add_argument("--update", choices=("delta", "inputs"), default=None,
                   help="override the config's weight-update strategy")
    p.add_argument("--backend", default=None, help="override the config's backend")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orion.train.config import TrainConfig
    from orion.train.trainer import Trainer

    config = TrainConfig.from_file(args.config)
    if args.update:
        config.update = args.update
    if args.backend:
        config.backend = args.backend
    trainer = Trainer(config, args.data, args.out, resume=args.resume,
                      progress=not args.no_progress, overwrite=args.overwrite)
    if args.steps is not None and trainer.step + args.steps > config.steps:
        print(f"orion train: note: --steps {args.steps} runs to step "
              f"{trainer.step + args.steps}, past the config's steps ({config.steps}); "
              "the learning rate stays at min_lr there", file=sys.stderr)
    try:
        records = trainer.fit(steps=args.steps)
    finally:
        trainer.close()
    done = [r for r in records if r.skipped is None]
    summary = {
        "out": str(trainer.out), "steps": trainer.step, "compiles": trainer.compiles,
        "final_loss": records[-1].loss if records else None,
        "final_val_loss": trainer.val_history[-1][1] if trainer.val_history else None,
        "skipped": len(records) - len(done),
        "mean_ms_per_step": sum(r.ms for r in records) / max(len(records), 1),
        "mean_update_ms": sum(r.update_ms for r in done) / max(len(done), 1),
    }
    if trainer.parallel.writes:     # one summary for a data-parallel run, from rank 0
        print(json.dumps(summary))
    return 0
