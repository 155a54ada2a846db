"""`orion lora --model M --data DIR --adapter-path OUT`: LoRA fine-tuning (mlx-lm's
`lora` command names). A thin caller of `orion.lora.trainer.LoraTrainer`."""

from __future__ import annotations

import argparse
import sys

from orion.cli.options import integer, real

DATA_FORMATS = """\
data: DIR holds train.jsonl and valid.jsonl (test.jsonl for --test), one JSON object
a line, each one of
  {"text": "..."}                           loss on every token
  {"prompt": "...", "completion": "..."}    loss on the completion only
  {"messages": [{"role": "user", "content": "..."}, ...]}
                                            rendered with the model's chat template,
                                            loss on the assistant turns only

ADAPTER_PATH receives adapter_config.json and adapter_model.safetensors (PEFT's
format), training_state.safetensors (for --resume), log.jsonl and loss.png. A folder
that already holds an adapter or a run is refused unless --resume or --overwrite.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "lora", help="fine-tune a LoRA adapter",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=DATA_FORMATS,
        description="Train a LoRA adapter for a model folder on a data folder (formats "
        "below). The base stays baked and frozen in the device programs; the adapter is "
        "written in PEFT's format.")
    p.add_argument("--model", "-m", default=None,
                   help="a Hugging Face model folder of any architecture Orion reads "
                   "(default: the shipped Shakespeare Llama)")
    p.add_argument("--data", required=True,
                   help="folder with train.jsonl and valid.jsonl (formats below)")
    p.add_argument("--adapter-path", required=True, help="output folder of the adapter")
    p.add_argument("--iters", type=integer(1), default=100, help="optimizer steps (100)")
    p.add_argument("--batch-size", type=integer(1, 1 << 16), default=4,
                   help="examples per micro-batch (4)")
    p.add_argument("--grad-accum", type=integer(1, 1 << 16), default=1,
                   help="micro-batches per optimizer step (1)")
    p.add_argument("--rank", type=integer(1, 1 << 16), default=8, help="LoRA rank r (8)")
    p.add_argument("--alpha", type=real(0.0, low_open=True), default=16.0,
                   help="LoRA alpha; the adapter's scale is alpha/r (16)")
    p.add_argument("--dropout", type=real(0.0, 1.0, high_open=True), default=0.0,
                   help="LoRA dropout on the adapter path (0: off)")
    p.add_argument("--targets", default="q_proj,v_proj",
                   help="comma-separated linear modules, named as PEFT's target_modules "
                   "(e.g. q_proj,v_proj; Phi-3: qkv_proj; GPT-2: c_attn), or all-linear")
    p.add_argument("--lr", "--learning-rate", type=real(0.0), default=1e-4, dest="lr",
                   help="learning rate of AdamW (1e-4)")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="constant, or cosine decay to 0 after the warm-up (constant)")
    p.add_argument("--warmup", type=integer(0), default=0, help="linear warm-up steps (0)")
    p.add_argument("--weight-decay", type=real(0.0), default=0.0,
                   help="AdamW's decoupled weight decay on A and B (0)")
    p.add_argument("--max-seq-length", type=integer(1), default=2048,
                   help="longer examples are truncated; never past the model's context, "
                   "which caps it (2048)")
    p.add_argument("--val-every", "--steps-per-eval", type=integer(0), default=20,
                   dest="val_every", help="validation loss every k steps; 0: at the end (20)")
    p.add_argument("--val-batches", type=integer(-1), default=25,
                   help="validation batches each time; -1: the whole valid set (25)")
    p.add_argument("--save-every", type=integer(0), default=100,
                   help="write the adapter and training state every k steps; 0: at the "
                   "end only (100)")
    p.add_argument("--seed", type=integer(0), default=0,
                   help="seed of the data order, A's initialization and dropout (0)")
    p.add_argument("--test", action="store_true",
                   help="after training, report the loss on DATA/test.jsonl")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue from ADAPTER_PATH/training_state.safetensors")
    mode.add_argument("--overwrite", action="store_true",
                      help="start afresh in an ADAPTER_PATH that holds an adapter or a run "
                      "(only its adapter and run files are replaced)")
    p.add_argument("--backend", default=None, help="vane or ane (default: the best)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orion.lora.trainer import LoraTrainConfig, LoraTrainer

    model = args.model
    if model is None:
        from orion.models.registry import default_model_path

        model = str(default_model_path())
    cfg = LoraTrainConfig(
        iters=args.iters, batch_size=args.batch_size, grad_accum=args.grad_accum,
        lr=args.lr, lr_schedule=args.lr_schedule, warmup=args.warmup,
        weight_decay=args.weight_decay, max_seq_length=args.max_seq_length,
        val_every=args.val_every, val_batches=args.val_batches, save_every=args.save_every,
        seed=args.seed, rank=args.rank, alpha=args.alpha, dropout=args.dropout,
        targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()))
    trainer = LoraTrainer(model, args.data, args.adapter_path, cfg, resume=args.resume,
                          overwrite=args.overwrite, backend=args.backend,
                          progress=not args.no_progress)
    try:
        if trainer.max_seq_length < cfg.max_seq_length:
            print(f"orion lora: note: --max-seq-length {cfg.max_seq_length} is past the "
                  f"model's context of {trainer.max_seq_length} tokens; sequences are cut "
                  "to the context", file=sys.stderr)
        if trainer.data["train"].truncated:
            print(f"orion lora: {trainer.data['train'].truncated} training examples "
                  f"truncated to {trainer.max_seq_length + 1} tokens")
        records = trainer.fit()
        if args.test:
            if "test" not in trainer.data:
                from orion.errors import LoraError

                raise LoraError(f"{args.data}: --test given, but no test.jsonl")
            print(f"test loss {trainer.evaluate('test'):.4f}")
    except BaseException:
        trainer.close(failed=True)   # a folder this run created goes, unless it saved
        raise
    trainer.close()
    if records:
        last = records[-1]
        print(f"step {last.step}: train loss {last.loss:.4f}, val loss "
              f"{last.extra.get('val_loss', float('nan')):.4f}; adapter in {args.adapter_path}")
    return 0
