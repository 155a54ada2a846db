"""`orion fuse --model BASE --adapter-path A --out DIR`: the adapter merged into the
base weights (W + s B A), written as a plain Hugging Face folder in the base's dtype."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fuse", help="merge a LoRA adapter into its base model",
        description="Write BASE with the adapter merged into its weights as a plain "
        "Hugging Face folder (config.json, model.safetensors, tokenizer files), in the "
        "base's dtype.")
    p.add_argument("--model", "-m", default=None,
                   help="base Llama folder (default: the shipped Shakespeare Llama)")
    p.add_argument("--adapter-path", required=True, help="PEFT adapter folder")
    p.add_argument("--out", "--save-path", required=True, dest="out",
                   help="output folder; one that holds a model or an adapter is refused "
                   "unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files fuse writes (config.json, model.safetensors, "
                   "tokenizer files) in an --out that holds them; any other model file "
                   "there is still refused")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orion.lora.fuse import fuse

    model = args.model
    if model is None:
        from orion.models.registry import default_model_path

        model = str(default_model_path())
    fuse(model, args.adapter_path, args.out, overwrite=args.overwrite)
    print(f"fused model in {args.out}")
    return 0
