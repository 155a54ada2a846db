"""The adapters a loaded model holds, and which one its programs compute with.

Several adapters stay loaded at once; `select(name)` picks one (or None, the base
model). Selection changes only what the LoRA inputs of the programs are fed: the
programs are compiled per `Signature` (adapted modules and program rank) and cached
by the model, so swapping between adapters of one signature, or back to one seen
before, compiles nothing and reloads nothing.

With no adapter selected the model runs its base programs (signature ()), the
programs it ran before LoRA existed: "zero-rank programs". The alternative, the LoRA
programs with their inputs held at zero, is measured against it in
benchmarks/test_bench_lora.py (docs/lora.md has the figures).
"""

from __future__ import annotations

import os

import numpy as np

from orion.lora.adapter import Adapter, load_adapter
from orion.lora.config import MODULES, LoraError
from orion.lora.graph import Signature, input_names, mask_name, signature
from orion.models.llama_config import LlamaConfig

_KIND_MODULES = {"attn_fwd": ("q_proj", "k_proj", "v_proj", "o_proj"),
                 "attn_bwd": ("q_proj", "k_proj", "v_proj", "o_proj"),
                 "ffn_fwd": ("gate_proj", "up_proj", "down_proj"),
                 "ffn_bwd": ("gate_proj", "up_proj", "down_proj")}
assert {m for ms in _KIND_MODULES.values() for m in ms} == set(MODULES)


def kind_feeds(feeds: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """The LoRA inputs of one program kind (attention or feed-forward modules)."""
    names = {n for m in _KIND_MODULES[kind] for n in (*input_names(m), mask_name(m))}
    return {k: v for k, v in feeds.items() if k in names}


class AdapterSet:
    def __init__(self, model: LlamaConfig) -> None:
        self.model = model
        self.adapters: dict[str, Adapter] = {}
        self.active: str | None = None

    def load(self, path: str | os.PathLike[str], name: str = "default") -> Adapter:
        return self.add(load_adapter(path, self.model), name)

    def add(self, adapter: Adapter, name: str = "default") -> Adapter:
        """Adds (or replaces) an adapter."""
        if adapter.model != self.model:
            raise LoraError(f"adapter {name!r} is for another model configuration")
        adapter.check(f"adapter {name!r}")
        self.adapters[name] = adapter
        return adapter

    def select(self, name: str | None) -> None:
        if name is not None and name not in self.adapters:
            raise LoraError(f"no adapter named {name!r} (loaded: {sorted(self.adapters)})")
        self.active = name

    @property
    def signature(self) -> Signature:
        return signature(self.adapters[self.active]) if self.active else ()
