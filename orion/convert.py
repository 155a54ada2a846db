"""`orion convert`: a Hugging Face folder to an MLX quantized folder, and back.

    quantize_folder(src, out, bits=4, group_size=64)
        every matrix (linear layers, the embedding) whose input width is whole groups,
        quantized as mlx.core.quantize does (orion.formats.mlx_quant, equal to it bit for
        bit in fp32), scales and biases stored in fp16 (the device's type); the rest in
        fp16; config.json with "quantization" (and the "quantization_config" copy mlx-lm
        writes), mlx-lm's tensor names (GPT-2's under "model.", [out, in]), and the
        source's tokenizer files. mlx-lm loads the folder; so does Orion.
    palettize_folder(src, out, bits=4, group_channels=16)
        every matrix (the layers' linear weights, the embedding, the classifier)
        palettized (orion.formats.palettize: a LUT per `group_channels` output
        channels, found by k-means, and a per-channel scale the device applies after
        the conv, ANE-C57); the rest in fp16; config.json with "palettization". Orion
        loads the folder; mlx-lm has no such layout.
    dequantize_model(src, out)
        an MLX quantized folder, a palettized folder or a GGUF file to a Hugging Face
        folder in fp16: the reference dequantization (mx.dequantize's, gguf-py's; a
        palettized weight's lut value times its scale) rounded once to fp16, the
        architecture's config.json, and the tokenizer (copied, or from the GGUF's
        metadata with its chat template).

The output folder follows `orion fuse`'s rule: a folder that holds a model is refused
unless `overwrite`, which replaces only the files written here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from orion.atomic import atomic_write_bytes
from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import inside
from orion.formats import mlx_quant as MQ
from orion.formats.safetensors import save_mixed
from orion.train.run_folder import FolderRule, RunFolder

TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "generation_config.json", "chat_template.jinja",
                   "vocab.json", "merges.txt")
MODEL_MARKERS = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin",
                 "*.gguf", "*.pt", "*.pth", "tokenizer*", "generation_config.json")
WRITTEN = ("config.json", "model.safetensors")


def _out_folder(out: Path, copied: tuple[str, ...], overwrite: bool) -> RunFolder:
    rule = FolderRule("--out", markers=MODEL_MARKERS, own_files=WRITTEN + copied, lock=None,
                      exclusive=True, holds="a model")
    return RunFolder(out, resume=False, overwrite=overwrite, rule=rule)


def _mlx_name(model_type: str, name: str) -> str:
    """mlx-lm's name of a transformers tensor name (GPT-2's live under "model.")."""
    if model_type == "gpt2" and name.startswith("transformer."):
        return "model." + name[len("transformer."):]
    return name


def _copy_tokenizer(src: Path, out: Path, names: tuple[str, ...]) -> None:
    for name in names:
        shutil.copyfile(inside(src, name), out / name)


def _open_float_source(src: Path, out: Path) -> tuple[Any, Any]:
    """The architecture and weights of a Hugging Face folder in floats, the source
    quantizing and palettizing take; a compressed source (a GGUF file, an MLX or a
    palettized folder) is refused by name."""
    from orion.models.registry import open_hf
    from orion.models.weights import FolderWeights

    if out.resolve() == src.resolve():
        raise InvalidArgumentError(f"{out}: the output folder must not be the source's")
    if src.is_file():
        raise ModelLoadError(f"{src}: a model file (GGUF) is compressed already; quantizing "
                             "takes a Hugging Face folder (orion convert --dequantize writes "
                             "one)")
    arch, weights = open_hf(src)
    if not isinstance(weights, FolderWeights):
        weights.close()
        raise ModelLoadError(f"{src}: already compressed; dequantize it first "
                             "(orion convert --dequantize)")
    return arch, weights


def _write_model(src: Path, out: Path, tensors: dict[str, tuple[np.ndarray, str]],
                 config: dict[str, Any], fmt: str, overwrite: bool) -> Path:
    """model.safetensors, config.json and the source's tokenizer files into `out`
    (`_out_folder`'s rule; nothing left half written on failure)."""
    copied = tuple(n for n in TOKENIZER_FILES if (src / n).is_file())
    folder = _out_folder(out, copied, overwrite)
    try:
        atomic_write_bytes(out / "model.safetensors",
                           save_mixed(tensors, metadata={"format": fmt}))
        atomic_write_bytes(out / "config.json", (json.dumps(config, indent=2) + "\n").encode())
        _copy_tokenizer(src, out, copied)
    except BaseException:
        folder.close(failed=True)
        raise
    folder.close()
    return out


def quantize_folder(src: str | Path, out: str | Path, *, bits: int = 4, group_size: int = 64,
                    overwrite: bool = False) -> Path:
    """See the module docstring."""
    src, out = Path(src), Path(out)
    if bits not in MQ.BITS or group_size not in MQ.GROUP_SIZES:
        raise InvalidArgumentError(f"--bits must be one of {MQ.BITS} and --group-size one of "
                                   f"{MQ.GROUP_SIZES}, got {bits} and {group_size}")
    spec = MQ.QuantSpec(bits, group_size)
    arch, weights = _open_float_source(src, out)
    tensors: dict[str, tuple[np.ndarray, str]] = {}
    try:
        for name, shape in arch.parameters().items():
            mlx = _mlx_name(arch.model_type, name)
            w = weights.fp32(name)
            if len(shape) == 2 and shape[1] % group_size == 0:
                words, scales, biases = MQ.quantize(w, spec)
                module = mlx[: -len(".weight")]
                tensors[mlx] = (words, "uint32")
                tensors[f"{module}.scales"] = (scales, "float16")
                tensors[f"{module}.biases"] = (biases, "float16")
            else:
                tensors[mlx] = (w, "float16")
    finally:
        weights.close()
    quant = {"group_size": group_size, "bits": bits, "mode": "affine"}
    config = dict(arch.to_config(), torch_dtype="float16", quantization=quant,
                  quantization_config=quant)
    return _write_model(src, out, tensors, config, "mlx", overwrite)


def palettize_folder(src: str | Path, out: str | Path, *, bits: int = 4,
                     group_channels: int = 16, overwrite: bool = False,
                     progress: bool = False) -> Path:
    """See the module docstring."""
    from orion.formats.palettize import PaletteSpec, palettize
    from orion.models.palettized_weights import palettizable

    src, out = Path(src), Path(out)
    spec = PaletteSpec.checked(bits, group_channels, "orion convert --palettize")
    arch, weights = _open_float_source(src, out)
    matrices = palettizable(arch)
    shapes = arch.parameters()
    chosen = [n for n in shapes if n in matrices and spec.fits(shapes[n])]
    tensors: dict[str, tuple[np.ndarray, str]] = {}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(int(np.prod(shapes[n])) for n in chosen), unit="weight",
                   unit_scale=True, desc="palettizing", dynamic_ncols=True)
    try:
        for name in shapes:
            w = weights.fp32(name)
            if name in chosen:
                codes, lut, scale = palettize(w, spec)
                module = name[: -len(".weight")]
                tensors[name] = (codes, "uint8")
                tensors[f"{module}.lut"] = (lut, "float16")
                tensors[f"{module}.channel_scale"] = (scale, "float16")
                if bar is not None:
                    bar.update(w.size)
            else:
                tensors[name] = (w.T if arch.stored_transposed(name) else w, "float16")
    finally:
        weights.close()
        if bar is not None:
            bar.close()
    config = dict(arch.to_config(), torch_dtype="float16", palettization=spec.to_json())
    return _write_model(src, out, tensors, config, "orion-palettized", overwrite)


def dequantize_model(src: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """See the module docstring."""
    from orion.models.registry import open_gguf_file, open_hf
    from orion.models.weights import save_folder

    src, out = Path(src), Path(out)
    if out.resolve() == src.resolve():
        raise InvalidArgumentError(f"{out}: the output folder must not be the source's")
    tokenizer = None
    if src.is_file():
        arch, weights, tokenizer = open_gguf_file(src)
        copied: tuple[str, ...] = ()
    else:
        arch, weights = open_hf(src)
        copied = tuple(n for n in TOKENIZER_FILES if (src / n).is_file())
    try:
        arrays = {n: weights.fp16(n).astype(np.float32) for n in arch.parameters()}
    finally:
        weights.close()
    extra = ("tokenizer.json", "tokenizer_config.json", "generation_config.json") \
        if tokenizer is not None else ()
    folder = _out_folder(out, copied + extra, overwrite)
    try:
        save_folder(out, arch, arrays, "float16")
        _copy_tokenizer(src, out, copied)
        if tokenizer is not None:
            _write_tokenizer(tokenizer, out)
    except BaseException:
        folder.close(failed=True)
        raise
    folder.close()
    return out


def _write_tokenizer(tok: object, out: Path) -> None:
    """A GGUF's tokenizer as transformers' files (tokenizer.json, its config with the
    chat template, the end tokens)."""
    backend = tok._tok  # type: ignore[attr-defined]
    atomic_write_bytes(out / "tokenizer.json", backend.to_str().encode())
    config: dict[str, object] = dict(tok.special_tokens)  # type: ignore[attr-defined]
    if tok.chat_template is not None:  # type: ignore[attr-defined]
        config["chat_template"] = tok.chat_template.source  # type: ignore[attr-defined]
    atomic_write_bytes(out / "tokenizer_config.json", json.dumps(config, indent=2).encode())
    ends = list(tok.eos_token_ids)  # type: ignore[attr-defined]
    atomic_write_bytes(out / "generation_config.json",
                       json.dumps({"eos_token_id": ends}).encode())
