"""`orion lora --model M --data DIR --adapter-path OUT`: LoRA fine-tuning (mlx-lm's
`lora` command names). A thin caller of `orion.lora.trainer.LoraTrainer`."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "lora", help="fine-tune a LoRA adapter",
        description="Train a LoRA adapter for a model folder on a data folder holding "
        "train.jsonl and valid.jsonl (lines {\"text\"} or {\"prompt\", \"completion\"}). "
        "The base stays baked and frozen in the device programs; the adapter is written "
        "in PEFT's format.")
    p.add_argument("--model", "-m", default=None,
                   help="a Hugging Face model folder of any architecture Orion reads "
                   "(default: the shipped Shakespeare Llama)")
    p.add_argument("--data", required=True, help="folder with train.jsonl, valid.jsonl")
    p.add_argument("--adapter-path", required=True, help="output folder of the adapter")
    p.add_argument("--iters", type=int, default=100, help="optimizer steps (100)")
    p.add_argument("--batch-size", type=int, default=4, help="examples per micro-batch (4)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (1)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank r (8)")
    p.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha; scale = alpha/r")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="LoRA dropout on the adapter path (0: off)")
    p.add_argument("--targets", default="q_proj,v_proj",
                   help="comma-separated linear modules, named as PEFT's target_modules "
                   "(e.g. q_proj,v_proj; Phi-3: qkv_proj; GPT-2: c_attn), or all-linear")
    p.add_argument("--lr", "--learning-rate", type=float, default=1e-4, dest="lr")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--warmup", type=int, default=0, help="linear warm-up steps (0)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-seq-length", type=int, default=2048,
                   help="longer examples are truncated (2048)")
    p.add_argument("--val-every", "--steps-per-eval", type=int, default=20, dest="val_every",
                   help="validation every k steps (20)")
    p.add_argument("--val-batches", type=int, default=25, help="-1: whole valid set")
    p.add_argument("--save-every", type=int, default=100, help="checkpoint every k steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test", action="store_true",
                   help="after training, report the loss on DATA/test.jsonl")
    p.add_argument("--resume", action="store_true",
                   help="continue from ADAPTER_PATH/training_state.safetensors")
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
                          backend=args.backend, progress=not args.no_progress)
    try:
        if trainer.data["train"].truncated:
            print(f"orion lora: {trainer.data['train'].truncated} training examples "
                  f"truncated to {cfg.max_seq_length + 1} tokens")
        records = trainer.fit()
        if args.test:
            if "test" not in trainer.data:
                from orion.errors import LoraError

                raise LoraError(f"{args.data}: --test given, but no test.jsonl")
            print(f"test loss {trainer.evaluate('test'):.4f}")
    finally:
        trainer.close()
    if records:
        last = records[-1]
        print(f"step {last.step}: train loss {last.loss:.4f}, val loss "
              f"{last.extra.get('val_loss', float('nan')):.4f}; adapter in {args.adapter_path}")
    return 0
