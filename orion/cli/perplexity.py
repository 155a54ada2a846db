"""`orion perplexity [--model M] [--adapter-path A] FILE`: the model's perplexity on a
text file, in strided windows (orion.perplexity: Hugging Face's perplexity guide,
llama.cpp's llama-perplexity), with a progress bar on a terminal."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "perplexity", help="perplexity of a model (and adapter) on a text file",
        description="Tokenize a UTF-8 text file as the model's tokenizer does (a BOS "
        "first where it adds one) and score it in windows of --context tokens whose "
        "starts are --stride apart: each window scores the tokens after the previous "
        "one's end, each from everything before it in the window. Prints perplexity = "
        "exp(mean negative log-likelihood) with its standard error; the figures are "
        "transformers' on the same model and text (tests/test_perplexity.py).")
    p.add_argument("file", help="UTF-8 text file")
    p.add_argument("--model", "-m", default=None,
                   help="model folder, file or repo id (default: the shipped Shakespeare "
                   "Llama)")
    p.add_argument("--adapter-path", default=None,
                   help="a PEFT LoRA adapter folder to apply (orion lora writes one)")
    p.add_argument("--context", "-c", type=int, default=None,
                   help="window length in tokens (default and most: the model's largest "
                   "prefill bucket within its context, 256 for the shipped model)")
    p.add_argument("--stride", type=int, default=None,
                   help="tokens between window starts (default: half the window)")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="score only the text's first N tokens (0: all)")
    p.add_argument("--backend", default=None, help="vane, ane or auto (default: the best)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orion
    from orion.errors import InvalidArgumentError
    from orion.files import MAX_TEXT_BYTES, read_text
    from orion.perplexity import perplexity

    if args.max_tokens < 0:
        raise InvalidArgumentError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    text = read_text(args.file, max_bytes=MAX_TEXT_BYTES)
    if args.model is None:
        from orion.models.registry import default_model_path

        args.model = str(default_model_path())
    model, tokenizer = orion.load(
        args.model, backend=args.backend,
        **({"adapter_path": args.adapter_path} if args.adapter_path else {}))
    try:
        ids = tokenizer.encode(text)
        if args.max_tokens:
            ids = ids[:args.max_tokens]
        from tqdm import tqdm

        # on a terminal only (None), unless --no-progress
        bar = tqdm(total=None, unit="window", file=sys.stderr,
                   disable=True if args.no_progress else None, desc="perplexity")

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        try:
            result = perplexity(model, ids, context=args.context, stride=args.stride,
                                progress=progress)
        finally:
            bar.close()
    finally:
        model.close()
    print(result.summary())
    return 0
