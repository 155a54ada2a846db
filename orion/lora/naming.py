"""The base model an adapter records (`base_model_name_or_path` in its
adapter_config.json), so that PEFT's `AutoPeftModelForCausalLM` finds it from any
folder: the model's name where it has one, else its absolute path. A path as typed
(`../models/x`) meant nothing from another folder, and the shipped model's
site-packages path nothing after a reinstall."""

from __future__ import annotations

import os
from pathlib import Path

# The model the package ships has no hub id; it is recorded by this name.
SHIPPED_NAME = "orion-ane/shakespeare-llama"


def base_model_name(model: str | os.PathLike[str], shipped: Path | None = None) -> str:
    """A hub id as given, the shipped model's name, a hub snapshot's repo id
    (`.../models--org--name/snapshots/<rev>` -> `org/name`), else the absolute path."""
    path = Path(model).expanduser()
    if not os.path.lexists(path):
        return os.fspath(model)     # not local: a repo id the loader fetched
    real = path.resolve()
    if shipped is not None and real == shipped.resolve():
        return SHIPPED_NAME
    repo = real.parent.parent.name
    if real.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--"):].replace("--", "/")
    return str(real)
