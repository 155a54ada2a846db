"""An adapter merged into its base (W + s B A for every adapted module), written as a
plain Hugging Face Llama folder in the base's dtype, with the base's tokenizer files."""

from __future__ import annotations

import shutil
from pathlib import Path

from orion.files import inside, read_json
from orion.formats.safetensors import SAVE_DTYPES
from orion.lora.adapter import load_adapter
from orion.lora.config import LoraError
from orion.lora.folders import fused_folder

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
    unless `overwrite`. Everything is loaded and merged before the folder is touched,
    and a merged value that is not finite in the base's dtype is refused by the writer."""
    from orion.models.llama_weights import load_hf, save_hf

    model, out = Path(model), Path(out)
    if out.resolve() == model.resolve():
        raise LoraError(f"{out}: the output folder must not be the base model's")
    dtype = base_dtype(model)
    cfg, weights = load_hf(model)            # fp32 (bf16 and fp16 widen exactly)
    adapter = load_adapter(adapter_path, cfg)
    merged = adapter.merged(weights)         # merged in fp32, rounded once when written
    copied = tuple(name for name in TOKENIZER_FILES if inside(model, name).is_file())
    folder = fused_folder(out, copied, overwrite=overwrite)
    try:
        save_hf(out, cfg, merged, dtype)
        for name in copied:
            shutil.copyfile(inside(model, name), out / name)
    except BaseException:
        folder.close(failed=True)   # a folder fuse created goes again
        raise
    folder.close()
