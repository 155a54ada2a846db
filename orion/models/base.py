"""The model protocol every causal LM in Orion implements, and `load_model`.

A model is a stateful object on a backend: `prefill` runs a prompt as one sequence
and fills the KV cache, `decode` appends one token against that cache, `reset`
empties it. Both return fp32 logits on the host. The tokenizer travels with the
model (`model.tokenizer`), and `model.stats` counts what the device did, so that a
caller can tell per call how many programs were compiled and how often the program
cache served a request.

`load_model(path_or_id)` picks the implementation from what is on disk:

    folder with config.json, "model_type": "gpt2"   -> orion.models.gpt2.load_gpt2
    folder with config.json, "model_type": "llama",
      "mistral", "qwen2" or "qwen3"                  -> orion.models.llama.load_llama
    a llama2.c checkpoint (.bin file, or a folder
      holding exactly one .bin and no config.json)   -> orion.models.llama.load_llama2c

Each loader takes `(path: Path, *, backend: str | None, **options)` and returns a
`CausalLM`. Implementations are imported lazily, so loading GPT-2 never imports the
Llama code and vice versa. A string that is not a local path but looks like a
Hugging Face repo id ("openai-community/gpt2") is fetched with `huggingface_hub`
when that package is installed and the network is reachable; nothing else in Orion
touches the network.
"""

from __future__ import annotations

import importlib
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import MAX_JSON_BYTES, UnsafeFileError, inside, read_json
from orion.tokenizers.base import Tokenizer

# ---- protocols --------------------------------------------------------------


@dataclass
class ModelStats:
    """Cumulative counters of one model since it was loaded.

    programs_compiled: compiles this model spent (each counts against the
                       process budget, ANE-C31)
    cache_hits:        requests for a program that was already compiled
    prefill_calls, decode_calls, prefill_ms, decode_ms: host wall time around the
                       device work, embedding and sampling excluded
    """

    programs_compiled: int = 0
    cache_hits: int = 0
    compile_ms: float = 0.0
    prefill_calls: int = 0
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    decode_calls: int = 0
    decode_ms: float = 0.0

    def snapshot(self) -> ModelStats:
        return ModelStats(**asdict(self))

    def since(self, before: ModelStats) -> ModelStats:
        """The counters accumulated since `before` (a snapshot of this object)."""
        now, then = asdict(self), asdict(before)
        return ModelStats(**{k: now[k] - then[k] for k in now})


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only LM with a KV cache on a backend.

    config:      the model's config dataclass (n_layer, n_embd, vocab_size, n_ctx, ...)
    tokenizer:   its tokenizer
    stats:       cumulative `ModelStats`
    position:    tokens in the KV cache now
    max_length:  the most tokens the cache holds (prompt + generated)
    backend:     the backend the programs run on ("vane", "ane")
    """

    config: Any
    tokenizer: Tokenizer
    stats: ModelStats

    @property
    def position(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def backend(self) -> str: ...

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Empties the cache, runs `ids` as one sequence and keeps its keys and values.

        Returns fp32 logits: [vocab] for the last position, or [len(ids), vocab]
        for every position when `all_logits`.
        """
        ...

    def decode(self, token: int) -> np.ndarray:
        """Runs one token at the next position against the cache: fp32 logits [vocab]."""
        ...

    def reset(self) -> None:
        """Empties the KV cache; compiled programs stay."""
        ...

    def close(self) -> None:
        """Releases programs and surfaces. Idempotent."""
        ...


def smallest_bucket(buckets: Sequence[int], need: int) -> int:
    """The smallest of the sorted `buckets` that holds `need` tokens (the caller has
    checked that the largest does: `prefill_beyond_buckets`, a full KV cache)."""
    return next(b for b in buckets if b >= need)


def prefill_beyond_buckets(model: CausalLM, ids: Sequence[int], largest_bucket: int,
                           all_logits: bool, note: str = "") -> np.ndarray | None:
    """The checks every KV-cache model's `prefill` makes on a prompt of `ids`. A prompt
    longer than the largest prefill bucket runs here, as a prefill of its head and a
    decode step per remaining token, and its last logits are returned; None means the
    prompt fits a bucket and the caller prefills it. `note` says why the context ends
    where it does."""
    n = len(ids)
    if n == 0:
        raise InvalidArgumentError("prefill needs at least one token")
    if n > model.max_length:
        raise InvalidArgumentError(f"a prompt of {n} tokens is over the context of "
                                   f"{model.max_length}{note}")
    if n <= largest_bucket:
        return None
    if all_logits:
        raise InvalidArgumentError(f"all_logits needs the prompt in one prefill bucket (at "
                                   f"most {largest_bucket} tokens), got {n}")
    logits = model.prefill(ids[:largest_bucket])
    for token in ids[largest_bucket:]:
        logits = model.decode(token)
    return logits


def check_token_ids(ids: Sequence[Any], vocab_size: int) -> list[int]:
    """`ids` as a list of ints, each in [0, vocab_size): a negative id would wrap to
    the last rows of the embedding, a float or a bool would be truncated silently."""
    out = []
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise InvalidArgumentError(f"token {i} is {t!r}, not an integer id")
        if not 0 <= int(t) < vocab_size:
            raise InvalidArgumentError(f"token {i} is {int(t)}, outside the vocabulary "
                                       f"[0, {vocab_size})")
        out.append(int(t))
    return out


def parameter_count(weights: Any) -> int:
    """Elements of every array in `weights`: a dict, list or dataclass of arrays (a
    tied head stored once counts once)."""
    if isinstance(weights, np.ndarray):
        return int(weights.size)
    counted = getattr(weights, "parameter_count", None)
    if callable(counted):   # a lazy folder counts from its headers
        return int(counted())
    if isinstance(weights, Mapping):
        return sum(parameter_count(v) for v in weights.values())
    if isinstance(weights, (list, tuple)):
        return sum(parameter_count(v) for v in weights)
    if hasattr(weights, "__dataclass_fields__"):
        return sum(parameter_count(getattr(weights, f)) for f in weights.__dataclass_fields__)
    return 0


def human_count(n: int) -> str:
    """1234 -> "1.2K", 2_200_000 -> "2.2M", 124_439_808 -> "124.4M"."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def describe_model(model: CausalLM, architecture: str, weights: Any, shape: str,
                   closed: bool = False) -> str:
    """The `repr` of a model: what it is, how big, where it runs."""
    return (f"<{type(model).__name__} {architecture}, {human_count(parameter_count(weights))}"
            f" parameters ({shape}), context {model.max_length} tokens, backend "
            f"{model.backend}{', closed' if closed else ''}>")


# ---- dispatch ---------------------------------------------------------------

Loader = Callable[..., CausalLM]

# model_type in config.json -> (module, function)
LOADERS: dict[str, tuple[str, str]] = {
    "gpt2": ("orion.models.gpt2", "load_gpt2"),
    "llama": ("orion.models.llama", "load_llama"),
    "mistral": ("orion.models.llama", "load_llama"),
    "qwen2": ("orion.models.llama", "load_llama"),
    "qwen3": ("orion.models.llama", "load_llama"),
}
LLAMA2C_LOADER = ("orion.models.llama", "load_llama2c")


def _import_loader(entry: tuple[str, str]) -> Loader:
    module_name, func_name = entry
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ModelLoadError(f"{module_name} is not part of this build") from exc
    return getattr(module, func_name)


def _looks_like_repo_id(text: str) -> bool:
    parts = text.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not text.startswith((".", "~"))
        and not any(c in text for c in "\\:")
    )


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
            "fetch a repo id) is not installed"
        ) from exc
    patterns = ["config.json", "*.safetensors", "*.json", "merges.txt", "vocab.bpe",
                "tokenizer.model"]
    try:
        return Path(snapshot_download(repo_id=text, allow_patterns=patterns))
    except Exception as exc:  # noqa: BLE001 - hub errors are many; one message here
        raise ModelLoadError(f"could not fetch {text!r} from the Hugging Face hub: {exc}") from exc


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


def find_loader(path: Path) -> tuple[Loader, Path]:
    """The loader for a local model path (see the module docstring) and the path to
    hand it: the folder of a Hugging Face model, the .bin file of a llama2.c one."""
    if path.is_file():
        if path.suffix == ".bin":
            return _import_loader(LLAMA2C_LOADER), path
        raise ModelLoadError(f"{path}: a model file must be a llama2.c .bin checkpoint")
    if not (path / "config.json").exists():
        bins = sorted(path.glob("*.bin"))
        if len(bins) == 1:
            try:   # the folder names it: it must be inside the folder
                return _import_loader(LLAMA2C_LOADER), inside(path, bins[0].name)
            except UnsafeFileError as exc:
                raise ModelLoadError(str(exc)) from None
        raise ModelLoadError(
            f"{path}: no config.json (a Hugging Face model folder) and no single "
            "llama2.c .bin checkpoint"
        )
    model_type = read_config_json(path).get("model_type")
    if model_type not in LOADERS:
        raise ModelLoadError(
            f"{path}: model_type {model_type!r} is not supported; "
            f"known: {', '.join(sorted(LOADERS))}"
        )
    return _import_loader(LOADERS[model_type]), path


def load_model(
    path_or_id: str | os.PathLike[str], *, backend: str | None = None, **options: Any
) -> CausalLM:
    """Loads a model (weights, tokenizer, compiled programs) from a path or repo id."""
    loader, target = find_loader(resolve_path(path_or_id))
    return loader(target, backend=backend, **options)
