"""`orion convert --model SRC --out DIR [--bits 4 --group-size 64 | --palettize
[--group-channels 16] | --dequantize]`: a Hugging Face folder quantized to an MLX folder
(mlx-lm and Orion load it) or palettized (the ANE's preferred form; Orion loads it), or
a compressed folder or GGUF file dequantized to an fp16 Hugging Face folder."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert", help="quantize a model folder (MLX layout), or dequantize one to fp16",
        description="Quantize a Hugging Face folder with MLX's affine quantization (the "
        "layout mlx_lm.convert writes: uint32 codes, fp16 scales and biases per group), or "
        "with --dequantize write an MLX quantized folder or a GGUF file as an fp16 Hugging "
        "Face folder. docs/quantization.md says what each format becomes on the device.")
    p.add_argument("--model", "-m", required=True, help="source folder (or .gguf file)")
    p.add_argument("--out", required=True, help="output folder; one that holds a model is "
                   "refused unless --overwrite")
    p.add_argument("--bits", type=int, default=4, help="bits a weight: 2, 3, 4, 5, 6 or 8 "
                   "(--palettize: 2, 3, 4, 6 or 8; default 4)")
    p.add_argument("--group-size", type=int, default=64,
                   help="weights per scale and bias: 32, 64 or 128 (default 64)")
    p.add_argument("--palettize", action="store_true",
                   help="palettize the layers' linear weights instead: a 2^bits-entry table "
                   "per --group-channels output channels (k-means) and a per-channel scale "
                   "after the conv, what the ANE decompresses on the fly (ANE-C57)")
    p.add_argument("--group-channels", type=int, default=16,
                   help="--palettize: output channels sharing a table: 1, 2, 4, 8, 16, 32 "
                   "or 64 (default 16)")
    p.add_argument("--dequantize", action="store_true",
                   help="write the source's weights in fp16 instead (an MLX quantized folder "
                   "or a GGUF file)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files convert writes in an --out that holds them")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orion.convert import dequantize_model, palettize_folder, quantize_folder

    if args.dequantize and args.palettize:
        from orion.errors import InvalidArgumentError

        raise InvalidArgumentError("--dequantize and --palettize cannot go together")
    if args.palettize:
        out = palettize_folder(args.model, args.out, bits=args.bits,
                               group_channels=args.group_channels, overwrite=args.overwrite,
                               progress=True)
        print(f"{args.bits}-bit palettized model (a table per {args.group_channels} "
              f"channels) in {out}")
    elif args.dequantize:
        out = dequantize_model(args.model, args.out, overwrite=args.overwrite)
        print(f"fp16 model in {out}")
    else:
        out = quantize_folder(args.model, args.out, bits=args.bits, group_size=args.group_size,
                              overwrite=args.overwrite)
        print(f"{args.bits}-bit model (groups of {args.group_size}) in {out}")
    return 0
