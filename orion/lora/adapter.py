"""An adapter's matrices: A [r, in] and B [out, r] per (layer, module), fp32 on the
host, in PEFT's file format (`adapter_config.json` + `adapter_model.safetensors`,
tensors `base_model.model.model.layers.N.<module>.lora_A.weight` / `lora_B.weight`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orion.errors import ModelLoadError
from orion.files import MAX_WEIGHT_BYTES, inside, read_json
from orion.formats.safetensors import read_file
from orion.lora.config import MODULES, LoraConfig, LoraError
from orion.models.llama_config import LlamaConfig
from orion.models.llama_weights import Weights, layer_key

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."

Key = tuple[int, str]      # (layer, short module name)


def module_shape(cfg: LlamaConfig, module: str) -> tuple[int, int]:
    """(out, in) of a Llama linear layer."""
    d, h, kv, q = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.q_dim
    return {"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q),
            "gate_proj": (h, d), "up_proj": (h, d), "down_proj": (d, h)}[module]


def tensor_name(layer: int, module: str, which: str) -> str:
    return f"{PREFIX}model.layers.{layer}.{MODULES[module]}.lora_{which}.weight"


@dataclass
class Adapter:
    """A LoRA adapter for one model: `matrices[(layer, module)] = (A, B)`, fp32."""

    config: LoraConfig
    model: LlamaConfig
    matrices: dict[Key, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def keys(self) -> Iterator[Key]:
        for layer in range(self.model.n_layers):
            for module in self.config.targets:
                yield layer, module

    def check(self, where: str) -> None:
        """Every targeted (layer, module) present with the shapes the model implies."""
        for layer, module in self.keys():
            if (layer, module) not in self.matrices:
                raise LoraError(f"{where}: no {tensor_name(layer, module, 'A')}")
            a, b = self.matrices[layer, module]
            out, inp = module_shape(self.model, module)
            r = self.config.rank(layer, module)
            for name, arr, shape in (("A", a, (r, inp)), ("B", b, (out, r))):
                if arr.shape != shape:
                    raise LoraError(f"{where}: {tensor_name(layer, module, name)} has shape "
                                    f"{arr.shape}, the config and model imply {shape}")
        extra = set(self.matrices) - set(self.keys())
        if extra:
            raise LoraError(f"{where}: matrices for modules the config does not target: "
                            f"{sorted(extra)[:3]}")

    def delta(self, layer: int, module: str) -> np.ndarray:
        """s B A, the [out, in] change of the module's weight."""
        a, b = self.matrices[layer, module]
        return np.float32(self.config.scale(layer, module)) * (b @ a)

    def merged(self, weights: Mapping[str, np.ndarray]) -> Weights:
        """The base weights with this adapter added to them (PEFT's merge_and_unload)."""
        out = dict(weights)
        for layer, module in self.keys():
            key = layer_key(layer, MODULES[module] + ".weight")
            out[key] = (np.asarray(weights[key], np.float32) + self.delta(layer, module)
                        ).astype(np.float32)
        return out

    def params(self) -> dict[str, np.ndarray]:
        """The matrices under their PEFT tensor names (views, for an optimizer)."""
        out: dict[str, np.ndarray] = {}
        for (layer, module), (a, b) in self.matrices.items():
            out[tensor_name(layer, module, "A")] = a
            out[tensor_name(layer, module, "B")] = b
        return out


def init_adapter(config: LoraConfig, model: LlamaConfig, seed: int = 0) -> Adapter:
    """PEFT's default initialization: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform
    with a = sqrt(5)), B = 0, so training starts from the base model exactly."""
    rng = np.random.default_rng(seed)
    ad = Adapter(config, model)
    for layer, module in ad.keys():
        out, inp = module_shape(model, module)
        r = config.rank(layer, module)
        bound = 1.0 / np.sqrt(inp)
        ad.matrices[layer, module] = (
            rng.uniform(-bound, bound, (r, inp)).astype(np.float32),
            np.zeros((out, r), np.float32))
    return ad


# ---- files ----------------------------------------------------------------------

def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the adapter file as fp32 (orion.formats.safetensors checks the
    header, the offsets and that every value is finite)."""
    try:
        tensors, _ = read_file(path, max_bytes=MAX_WEIGHT_BYTES, fp16_range=False)
    except ModelLoadError as exc:
        raise LoraError(str(exc)) from None
    return tensors


def load_adapter(folder: str | os.PathLike[str], model: LlamaConfig) -> Adapter:
    """A PEFT adapter folder for a model of config `model`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LoraError(f"{folder}: not an adapter folder")
    cfg_path = inside(folder, CONFIG_FILE)
    config = LoraConfig.from_peft(read_json(cfg_path), str(cfg_path))
    w_path = inside(folder, WEIGHTS_FILE)
    if not w_path.exists():
        raise LoraError(f"{folder}: no {WEIGHTS_FILE} (adapter_model.bin is a pickle, which "
                        "Orion does not read)")
    tensors = _read_safetensors(w_path)
    ad = Adapter(config, model)
    names = set(tensors)
    for layer, module in ad.keys():
        na, nb = tensor_name(layer, module, "A"), tensor_name(layer, module, "B")
        if na not in tensors or nb not in tensors:
            raise LoraError(f"{w_path}: no {na if na not in tensors else nb}")
        ad.matrices[layer, module] = (tensors[na], tensors[nb])
        names -= {na, nb}
    if names:
        raise LoraError(f"{w_path}: tensors the config does not explain: {sorted(names)[:3]}")
    ad.check(str(w_path))
    return ad


def save_adapter(folder: str | os.PathLike[str], adapter: Adapter) -> None:
    """PEFT's two files, each written atomically."""
    from orion.atomic import atomic_write_bytes
    from orion.formats.safetensors import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = save(adapter.params(), "float32", metadata={"format": "pt"})
    atomic_write_bytes(folder / WEIGHTS_FILE, data)
    text = json.dumps(adapter.config.to_peft(), indent=2) + "\n"
    atomic_write_bytes(folder / CONFIG_FILE, text.encode())
