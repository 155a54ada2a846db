"""An adapter merged into its base (W + s B A for every adapted module), written as a
plain Hugging Face folder of the base's architecture in the base's dtype, with the
base's tokenizer files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from orion.errors import LoraError
from orion.files import inside, read_json
from orion.formats.safetensors import SAVE_DTYPES
from orion.lora.folders import fused_folder
from orion.models.adapters import load_adapter

TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "generation_config.json")


def base_dtype(folder: Path) -> str:
    cfg = read_json(inside(folder, "config.json"))
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    if name not in SAVE_DTYPES:
        raise LoraError(f"{folder}/config.json: fuse writes {', '.join(SAVE_DTYPES)} "
                        f"weights; the base is {name}")
    return str(name)


def fuse(model: str | Path, adapter_path: str | Path, out: str | Path, *,
         overwrite: bool = False) -> None:
    """Writes `model` with the adapter merged into `out`. `out` follows the output
    folder rule (orion.lora.folders): a folder holding a model or an adapter is refused
    unless `overwrite`. Everything is loaded and merged before the folder is touched;
    a merged value outside fp16's range (what Orion runs) is refused, and the writer
    refuses one that is not finite in the base's dtype."""
    from orion.models.registry import load_hf_arrays
    from orion.models.weights import save_folder

    model, out = Path(model), Path(out)
    if out.resolve() == model.resolve():
        raise LoraError(f"{out}: the output folder must not be the base model's")
    dtype = base_dtype(model)
    arch, weights = load_hf_arrays(model)      # fp32 (bf16 and fp16 widen exactly)
    adapter = load_adapter(adapter_path, arch)
    merged = adapter.merged(weights)           # in fp32, rounded once when written
    for name, w in merged.items():
        if not np.isfinite(w).all() or float(np.abs(w).max(initial=0.0)) > 65504.0:
            raise LoraError(f"{name}: the merged weight is not finite or leaves fp16's "
                            "range; nothing was written")
    copied = tuple(name for name in TOKENIZER_FILES if inside(model, name).is_file())
    folder = fused_folder(out, copied, overwrite=overwrite)
    try:
        save_folder(out, arch, merged, dtype)
        for name in copied:
            shutil.copyfile(inside(model, name), out / name)
    except BaseException:
        folder.close(failed=True)   # a folder fuse created goes again
        raise
    folder.close()
