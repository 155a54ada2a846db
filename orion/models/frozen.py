"""A quantized model as a frozen base to train adapters on (QLoRA's shape): its layer
matrices stay compressed (`QuantTensor`, baked into the training programs as the
device's constexpr ops), everything the host reads (the embedding, the classifier,
norms, biases) is dense fp32, as `load_hf_arrays` gives it for a plain model.

    arch, base, tok = frozen_base("model-4bit/")   # an MLX folder or a .gguf file
    base["model.norm.weight"]                       # fp32
    base.quant("model.layers.0.mlp.up_proj.weight") # the compressed matrix

It is a Mapping (what the training stack indexes) and a WeightSource (what graph blocks
read); indexing a compressed matrix decodes it (nothing in LoRA training does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from orion.ir.quant import QuantTensor
from orion.models.architecture import Architecture
from orion.models.weights import Rows


class FrozenWeights(Mapping[str, np.ndarray]):
    def __init__(self, shapes: Mapping[str, tuple[int, ...]], dense: dict[str, np.ndarray],
                 quant: dict[str, QuantTensor]) -> None:
        self.shapes, self.dense, self.quantized = dict(shapes), dense, quant

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.dense:
            return self.dense[name]
        return self.quantized[name].dense().astype(np.float32)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def quant(self, name: str, rows: slice | None = None) -> QuantTensor | None:
        q = self.quantized.get(name)
        if q is None or rows is None:
            return q
        lo, hi, _ = rows.indices(q.shape[0])
        return q.rows(lo, hi)

    def names(self) -> list[str]:
        return list(self.shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def fp32(self, name: str, rows: Rows = None) -> np.ndarray:
        a = self[name]
        return np.array(a if rows is None else a[rows], np.float32)

    def fp16(self, name: str, rows: Rows = None) -> np.ndarray:
        return self.fp32(name, rows).astype(np.float16)

    def rows_fp32(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        return self.fp32(name, ids)

    def parameter_count(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes.values())

    def fingerprint(self) -> str:
        """A digest of every dense array and compressed matrix (in memory, read whole)."""
        h = hashlib.sha256()
        for name in sorted(self.dense):
            a = np.ascontiguousarray(self.dense[name])
            h.update(repr((name, a.dtype.str, a.shape)).encode())
            h.update(a)
        for name in sorted(self.quantized):
            h.update(name.encode() + self.quantized[name].digest())
        return h.hexdigest()

    def close(self) -> None:
        pass


def frozen_base(path: str | Path) -> tuple[Architecture, FrozenWeights, Any]:
    """The architecture, the frozen base and the tokenizer (None when the model ships
    none) of a quantized model: an MLX folder or a GGUF file."""
    from orion.models.registry import folder_tokenizer, open_gguf_file, open_hf

    path = Path(path)
    if path.is_file():
        arch, source, tok = open_gguf_file(path)
    else:
        arch, source = open_hf(path)
        tok = folder_tokenizer(path, arch.args.vocab_size)
    host = {arch.embed_name, arch.classifier_name}
    dense: dict[str, np.ndarray] = {}
    quant: dict[str, QuantTensor] = {}
    try:
        for name in arch.parameters():
            q = source.quant(name) if name not in host else None
            if q is not None:
                quant[name] = q
            else:
                dense[name] = source.fp32(name)
    finally:
        source.close()
    return arch, FrozenWeights(arch.parameters(), dense, quant), tok


def is_quantized(path: str | Path) -> bool:
    """Whether `path` is a GGUF file or a folder whose config.json says it is quantized
    or palettized."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".gguf"
    from orion.models.registry import read_config_json

    if not (path / "config.json").exists():
        return False
    config = read_config_json(path)
    return "quantization" in config or "palettization" in config
