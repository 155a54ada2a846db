"""From a path (or a Hugging Face repo id) to a loaded model.

    model = load_model("~/models/Qwen3-0.6B")          # a TransformerLM
    model = load_model("stories15M.bin")               # a llama2.c checkpoint

A folder with config.json is read by the architecture file named by its `model_type`
(`orion/models/architectures/<model_type>.py`): adding an architecture is adding its
file, with no list to edit. A llama2.c checkpoint (a .bin file, or a folder holding
exactly one .bin and no config.json) is a Llama. A string that is not a local path but
looks like a repo id ("openai-community/gpt2") is fetched with `huggingface_hub` when
that package is installed and the network reachable; nothing else in Orion touches the
network.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from pathlib import Path
from typing import Any

from orion.errors import ModelLoadError
from orion.files import MAX_JSON_BYTES, UnsafeFileError, inside, read_json
from orion.models import architectures
from orion.models.architecture import Architecture
from orion.models.runtime import RuntimeOptions, TransformerLM
from orion.models.weights import ArrayWeights, WeightSource, check_arrays, open_folder
from orion.tokenizers.base import Tokenizer

_MODEL_TYPE = re.compile(r"[a-z][a-z0-9_]*\Z")


def known_model_types() -> list[str]:
    """The model_type of every architecture file, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(architectures.__path__)
                  if not m.name.startswith("_"))


def architecture_class(model_type: object, where: str) -> type[Architecture]:
    """The `Model` class of `orion/models/architectures/<model_type>.py`."""
    known = known_model_types()
    if not isinstance(model_type, str) or not _MODEL_TYPE.match(model_type) \
            or model_type not in known:
        shown = repr(model_type) if isinstance(model_type, str) else \
            f"{type(model_type).__name__} {str(model_type)[:60]}"
        raise ModelLoadError(f"{where}: model_type {shown} is not supported; known: "
                             f"{', '.join(known)}")
    module = importlib.import_module(f"{architectures.__name__}.{model_type}")
    return module.Model


def architecture_from_config(config: dict[str, Any], where: str) -> Architecture:
    return architecture_class(config.get("model_type"), where).from_config(config, where)


def read_config_json(folder: Path) -> dict[str, Any]:
    config_path = folder / "config.json"
    if not os.path.lexists(config_path):
        raise ModelLoadError(f"{folder}: no config.json")
    try:
        config = read_json(inside(folder, "config.json"), max_bytes=MAX_JSON_BYTES)
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path}: expected a JSON object")
    return config


def _without_quantization(config: dict[str, Any]) -> dict[str, Any]:
    """config.json without MLX's "quantization" (and the copy mlx-lm writes of it as
    "quantization_config"; any other quantization_config stays, for the architecture
    to refuse)."""
    out = dict(config)
    q = out.pop("quantization")
    if out.get("quantization_config") == q:
        del out["quantization_config"]
    return out


def open_hf(folder: str | os.PathLike[str]) -> tuple[Architecture, WeightSource]:
    """A Hugging Face folder's architecture and its weights, checked whole before
    anything is allocated (`orion.models.weights.open_folder`); an MLX quantized
    folder (config.json's "quantization") through `orion.models.mlx_weights`, a
    palettized one ("palettization") through `orion.models.palettized_weights`."""
    from orion.formats.mlx_quant import QuantConfig
    from orion.formats.palettize import PaletteSpec

    folder = Path(folder)
    config = read_config_json(folder)
    where = str(folder / "config.json")
    qcfg = QuantConfig.read(config, where)
    palette = PaletteSpec.read(config, where)
    if qcfg is not None and palette is not None:
        raise ModelLoadError(f"{where}: both quantization and palettization; a folder "
                             "holds one or the other")
    if palette is not None:
        from orion.models.palettized_weights import open_palettized_folder

        plain = {k: v for k, v in config.items() if k != "palettization"}
        arch = architecture_from_config(plain, where)
        return arch, open_palettized_folder(arch, folder, palette)
    if qcfg is None:
        arch = architecture_from_config(config, where)
        return arch, open_folder(arch, folder)
    from orion.models.mlx_weights import open_mlx_folder

    arch = architecture_from_config(_without_quantization(config), where)
    return arch, open_mlx_folder(arch, folder, qcfg)


def open_gguf_file(path: Path) -> tuple[Architecture, WeightSource, Tokenizer | None]:
    """A GGUF file's architecture, weights and tokenizer (None: the file has no
    vocabulary), all checked before anything is allocated."""
    from orion.models.gguf_model import open_gguf, open_gguf_model
    from orion.tokenizers.gguf import gguf_tokenizer

    config, f = open_gguf_model(path)
    arch = architecture_from_config(config, str(path))
    weights = open_gguf(arch, f)
    tok = gguf_tokenizer(f.metadata, str(path))
    f.forget_lists("tokenizer.ggml.")
    if tok is not None and tok.vocab_size > arch.args.vocab_size:
        raise ModelLoadError(f"{path}: the tokenizer has {tok.vocab_size} tokens, the "
                             f"model {arch.args.vocab_size}")
    return arch, weights, tok


def load_hf_arrays(folder: str | os.PathLike[str]
                   ) -> tuple[Architecture, dict[str, Any]]:
    """A Hugging Face folder's weights as fp32 arrays (training, conversions)."""
    arch, weights = open_hf(folder)
    try:
        return arch, {name: weights.fp32(name) for name in weights.names()}
    finally:
        weights.close()


def _looks_like_repo_id(text: str) -> bool:
    parts = text.split("/")
    return (len(parts) == 2 and all(parts) and not text.startswith((".", "~"))
            and not any(c in text for c in "\\:"))


def resolve_path(path_or_id: str | os.PathLike[str]) -> Path:
    """A local path as given; a Hugging Face repo id downloaded to the local cache.

    The download needs `huggingface_hub` and a network; it fetches only the files a
    loader reads (config, safetensors weights, tokenizer files).
    """
    path = Path(path_or_id).expanduser()
    if path.exists():
        return path
    text = os.fspath(path_or_id)
    if not _looks_like_repo_id(text):
        raise ModelLoadError(f"no model at {text!r}: no such file or folder")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ModelLoadError(
            f"no model at {text!r}: not a local path, and huggingface_hub (needed to "
            "fetch a repo id) is not installed") from exc
    patterns = ["config.json", "*.safetensors", "*.json", "merges.txt", "vocab.bpe",
                "tokenizer.model"]
    try:
        return Path(snapshot_download(repo_id=text, allow_patterns=patterns))
    except Exception as exc:  # noqa: BLE001 - hub errors are many; one message here
        raise ModelLoadError(f"could not fetch {text!r} from the Hugging Face hub: {exc}") \
            from exc


def folder_tokenizer(folder: Path, vocab_size: int) -> Tokenizer | None:
    """The tokenizer a model folder ships (None when it has none Orion reads), refused
    when it has more ids than the model's embedding has rows."""
    from orion.tokenizers import load_tokenizer

    tok = load_tokenizer(folder)
    if tok is not None and tok.vocab_size > vocab_size:
        raise ModelLoadError(f"{folder}: the tokenizer has {tok.vocab_size} tokens, the "
                             f"model {vocab_size}")
    return tok


def _with_adapter(model: TransformerLM, adapter_path: str | os.PathLike[str] | None
                  ) -> TransformerLM:
    """`adapter_path` loaded as "default" and selected (a bad one closes the model)."""
    if adapter_path is not None:
        try:
            model.load_adapter(adapter_path)
            model.set_adapter("default")
        except BaseException:
            model.close()
            raise
    return model


def load_model(path_or_id: str | os.PathLike[str], *, backend: str | None = None,
               tokenizer: Tokenizer | None = None, options: RuntimeOptions | None = None,
               adapter_path: str | os.PathLike[str] | None = None, **overrides: Any
               ) -> TransformerLM:
    """Loads a model (weights, tokenizer, and the runtime that compiles its programs on
    first use) from a path or repo id. Keyword overrides set `RuntimeOptions` fields
    (prefill_buckets=..., decode_buckets=..., numerics=...); `adapter_path`: a PEFT
    LoRA adapter folder, loaded as "default" and selected."""
    path = resolve_path(path_or_id)
    opts = RuntimeOptions.with_overrides(options, dict(overrides))
    if path.is_file() and path.suffix == ".gguf":
        arch, weights, gguf_tok = open_gguf_file(path)
        tok = tokenizer or gguf_tok or arch.default_tokenizer()
        model = TransformerLM(arch, weights, tok, backend=backend, options=opts,
                              source=str(path))
        return _with_adapter(model, adapter_path)
    if path.is_file() or not (path / "config.json").exists():
        bin_path = _llama2c_file(path)
        from orion.formats.llama2c import read_llama2c
        from orion.models.architectures.llama import Model as Llama

        config, arrays = read_llama2c(bin_path)
        arch = Llama.from_config(config, str(bin_path))
        weights: Any = ArrayWeights(check_arrays(arch, arrays, str(bin_path)))
        tok = tokenizer or folder_tokenizer(bin_path.parent, arch.args.vocab_size)
        if tok is None:
            raise ModelLoadError(f"{bin_path.parent}: no tokenizer.model beside the "
                                 "checkpoint")
        source = bin_path
    else:
        arch, weights = open_hf(path)
        tok = tokenizer or folder_tokenizer(path, arch.args.vocab_size) \
            or arch.default_tokenizer()
        source = path
    model = TransformerLM(arch, weights, tok, backend=backend, options=opts,
                          source=str(source))
    return _with_adapter(model, adapter_path)


def _llama2c_file(path: Path) -> Path:
    """The llama2.c checkpoint a path names: the .bin file itself, or the one .bin of a
    folder that has no config.json."""
    if path.is_file():
        if path.suffix == ".bin":
            return path
        raise ModelLoadError(f"{path}: a model file must be a GGUF file (.gguf) or a "
                             "llama2.c .bin checkpoint")
    bins = sorted(path.glob("*.bin"))
    if len(bins) == 1:
        try:   # the folder names it: it must be inside the folder
            return inside(path, bins[0].name)
        except UnsafeFileError as exc:
            raise ModelLoadError(str(exc)) from None
    raise ModelLoadError(f"{path}: no config.json (a Hugging Face model folder) and no "
                         "single llama2.c .bin checkpoint")


def default_model_path() -> Path:
    """The model the package ships (orion/assets/shakespeare-llama): a small Llama
    trained on Shakespeare with Orion (docs/training.md has the command)."""
    return Path(__file__).resolve().parents[1] / "assets" / "shakespeare-llama"
