"""The output folders of `orion lora --adapter-path` and `orion fuse --out`, under the
rule `orion train --out` follows (orion.train.run_folder): a folder that holds an
adapter, a run or a model is refused unless `--overwrite` (or `--resume` for lora);
`--overwrite` removes only the files the command writes; a failed run removes the
folders it created. Before this, a second `orion lora` into a folder silently replaced
a 30-step adapter and its log with a 1-step one, and `orion fuse` replaced any
folder's config.json.
"""

from __future__ import annotations

import os
from pathlib import Path

from orion.train.run_folder import LOG, FolderRule, RunFolder

STATE = "training_state.safetensors"
# PEFT's two files (orion.formats.peft), the training state, the log and the plot
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", STATE, LOG, "loss.png")
# what makes a folder a model folder (and so not a place for another model's files)
MODEL_MARKERS = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin",
                 "*.gguf", "*.pt", "*.pth", "tokenizer*", "special_tokens_map.json",
                 "generation_config.json", "vocab.json", "merges.txt", "chat_template.jinja",
                 "adapter_config.json", LOG)
FUSED_FILES = ("config.json", "model.safetensors")

ADAPTER = FolderRule("--adapter-path", markers=(*ADAPTER_FILES, "config.json", "*.safetensors"),
                     own_files=ADAPTER_FILES, resume=STATE, lock=".orion-lora.lock",
                     keep_lock=False, holds="an adapter, its training or a model")


def adapter_folder(path: str | os.PathLike[str], *, resume: bool, overwrite: bool
                   ) -> RunFolder:
    """`orion lora`'s folder, locked and claimed (see the module docstring)."""
    return RunFolder(path, resume=resume, overwrite=overwrite, rule=ADAPTER)


def fused_folder(path: str | os.PathLike[str], copied: tuple[str, ...], *,
                 overwrite: bool) -> RunFolder:
    """`orion fuse`'s folder: it writes config.json, model.safetensors and the base's
    tokenizer files `copied`; with `overwrite` it replaces those and refuses a folder
    holding any other model file (a stale shard or tokenizer would load beside them)."""
    rule = FolderRule("--out", markers=MODEL_MARKERS, own_files=FUSED_FILES + copied,
                      lock=None, exclusive=True, holds="a model or an adapter")
    return RunFolder(Path(path), resume=False, overwrite=overwrite, rule=rule)
