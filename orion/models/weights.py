"""A model's tensors by their parameter names, wherever they live.

    FolderWeights   a Hugging Face folder's safetensors, memory-mapped: each read
                    converts what it returns and keeps nothing, so a loaded model holds
                    no host copy of its weights (programs bake them as they are built)
    ArrayWeights    arrays in memory (a llama2.c checkpoint, training's masters)

Both read a linear layer [out, in] whatever the file's orientation (`Architecture.
stored_transposed`), fp16 for the device or fp32 for the host. `open_folder` checks a
folder against an architecture before anything is allocated: every name present and
expected, every shape, every value finite and within fp16's range.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from orion.errors import ModelLoadError
from orion.formats.safetensors import SafetensorsFolder
from orion.ir.quant import QuantTensor
from orion.models.architecture import Architecture

Rows = np.ndarray | slice | None


class WeightSource(Protocol):
    """Tensors by parameter name."""

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def fp32(self, name: str, rows: Rows = None) -> np.ndarray: ...

    def fp16(self, name: str, rows: Rows = None) -> np.ndarray: ...

    def rows_fp32(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        """Rows of a table, read on the hot path (an embedding lookup per token)."""
        ...

    def parameter_count(self) -> int: ...

    def quant(self, name: str, rows: slice | None = None) -> QuantTensor | None:
        """The parameter as the device holds it compressed (an MLX folder's or a GGUF
        file's matrices); None: it is stored as floats and baked in fp16. `rows`: a run
        of its rows (a classifier chunk, whose blocks it does not cut), built alone:
        the whole table never sits in memory for one chunk of it."""
        ...

    def fingerprint(self) -> str:
        """A digest that changes whenever a tensor may have (the program store's key
        covers it: `orion.models.store_keys`)."""
        ...

    def close(self) -> None:
        """Lets go of mappings and descriptors (a later read opens them again)."""
        ...


class FolderWeights:
    """The tensors of a checked folder (see `open_folder`)."""

    def __init__(self, arch: Architecture, st: SafetensorsFolder, names: dict[str, str]
                 ) -> None:
        self.arch, self.st = arch, st
        self._names = names   # parameter name -> name in the files

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        s = self.st.shape(self._names[name])
        return s[::-1] if self.arch.stored_transposed(name) else s

    def _read(self, name: str, rows: Rows, fp16: bool) -> np.ndarray:
        file_name = self._names[name]
        try:
            if self.arch.stored_transposed(name):
                if rows is not None:
                    raise ModelLoadError(f"rows of {name} are columns of its file")
                w = self.st.fp16(file_name) if fp16 else self.st.fp32(file_name)
                return np.ascontiguousarray(w.T)
            return self.st.fp16(file_name, rows) if fp16 else self.st.fp32(file_name, rows)
        finally:
            # the pages a read touched leave the RSS (a table read a chunk at a time
            # would otherwise stay resident whole)
            self.st.close()

    def fp32(self, name: str, rows: Rows = None) -> np.ndarray:
        return self._read(name, rows, fp16=False)

    def fp16(self, name: str, rows: Rows = None) -> np.ndarray:
        return self._read(name, rows, fp16=True)

    def rows_fp32(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        # read, not mapped: mapping and unmapping per decode step cost ~200 us a token
        return self.st.read_rows_fp32(self._names[name], ids)

    def parameter_count(self) -> int:
        """From the headers: counting must not read the weights."""
        return sum(int(np.prod(self.st.shape(n))) for n in self._names.values())

    def quant(self, name: str, rows: slice | None = None) -> QuantTensor | None:
        return None

    def fingerprint(self) -> str:
        """The files' identity and headers (`SafetensorsFolder.fingerprint`) and the
        names read from them: no tensor is read."""
        names = repr(sorted(self._names.items())).encode()
        return hashlib.sha256(self.st.fingerprint().encode() + names).hexdigest()

    def close(self) -> None:
        self.st.close()


class ArrayWeights(Mapping[str, np.ndarray]):
    """Arrays in memory under parameter names ([out, in] for linear layers)."""

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = dict(arrays)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def names(self) -> list[str]:
        return list(self.arrays)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.arrays[name].shape)

    def fp32(self, name: str, rows: Rows = None) -> np.ndarray:
        a = self.arrays[name]
        return np.array(a if rows is None else a[rows], np.float32)

    def fp16(self, name: str, rows: Rows = None) -> np.ndarray:
        a = self.arrays[name]
        return np.asarray(a if rows is None else a[rows]).astype(np.float16)

    def rows_fp32(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        return self.fp32(name, ids)

    def parameter_count(self) -> int:
        return sum(int(a.size) for a in self.arrays.values())

    def quant(self, name: str, rows: slice | None = None) -> QuantTensor | None:
        return None

    def fingerprint(self) -> str:
        """A digest of every array's name, dtype, shape and bytes (read in full, ~1 GB/s:
        the arrays are in memory and may change between two calls)."""
        h = hashlib.sha256()
        for name in sorted(self.arrays):
            a = np.ascontiguousarray(self.arrays[name])
            h.update(repr((name, a.dtype.str, a.shape)).encode())
            h.update(a)   # a C-contiguous buffer, hashed in place
        return h.hexdigest()

    def close(self) -> None:
        pass


def init_weights(arch: Architecture, seed: int = 0) -> dict[str, np.ndarray]:
    """Fresh fp32 weights, llama2.c's initialization: N(0, 0.02) for matrices and
    embeddings, N(0, 0.02 / sqrt(2 L)) for the projections into the residual stream,
    the architecture's norm gain (1, or 0 for a (1 + w) gain) and zero biases."""
    rng = np.random.default_rng(seed)
    small = 0.02 / np.sqrt(2 * arch.args.n_layers)
    residual = tuple(f"{m}.weight" for m in arch.residual_projections)
    out: dict[str, np.ndarray] = {}
    for name, shape in arch.parameters().items():
        if len(shape) == 1:
            value = 0.0 if name.endswith(".bias") else arch.norm_init
            out[name] = np.full(shape, value, np.float32)
        else:
            std = small if name.endswith(residual) else 0.02
            out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def check_arrays(arch: Architecture, weights: Mapping[str, np.ndarray], where: str
                 ) -> dict[str, np.ndarray]:
    """The weights as fp32, after checking every name and shape against the model."""
    shapes = arch.parameters()
    missing = sorted(set(shapes) - set(weights))
    extra = sorted(set(weights) - set(shapes))
    if missing or extra:
        raise ModelLoadError(f"{where}: missing tensors {missing[:5]}, unexpected {extra[:5]}")
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        arr = np.asarray(weights[name])
        if arr.shape != shape:
            raise ModelLoadError(f"{where}: {name} has shape {arr.shape}, expected {shape}")
        out[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return out


def parameter_files(arch: Architecture, files: Sequence[str], folder: Path) -> dict[str, str]:
    """Parameter name -> the name of the file tensor that holds it, for every parameter
    of `arch` once: a ModelLoadError naming what is missing or unexpected otherwise
    (compressed tensors that config.json does not say how to read, by their kind)."""
    shapes = arch.parameters()
    names = arch.file_names(files)
    if arch.args.tie_embeddings:   # some tied checkpoints store the shared matrix twice
        names.pop(arch.head_name, None)
    missing = sorted(set(shapes) - set(names))
    extra = sorted(set(names) - set(shapes))
    if any(n.endswith(".lut") for n in extra):
        raise ModelLoadError(f"{folder}: the weights hold palettized matrices ("
                             f"{next(n for n in extra if n.endswith('.lut'))}, ...) but "
                             "config.json has no \"palettization\" saying how")
    if any(n.endswith(".scales") for n in extra):
        raise ModelLoadError(f"{folder}: the weights hold quantized modules ("
                             f"{next(n for n in extra if n.endswith('.scales'))}, ...) but "
                             "config.json has no \"quantization\" saying how they are "
                             "quantized")
    if missing or extra:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(
            f"{folder}: the weights do not match config.json ({arch.model_type}, "
            f"{arch.args.n_layers} layers): missing {missing[:5]}{more}, unexpected "
            f"{extra[:5]} (a different architecture, or config.json does not match the "
            "weights)")
    return names


def open_folder(arch: Architecture, folder: Path) -> FolderWeights:
    """The folder's safetensors checked whole against `arch` (see the module doc)."""
    st = SafetensorsFolder(folder)
    shapes = arch.parameters()
    names = parameter_files(arch, [n for n in st if not arch.ignored_tensors(n)], folder)
    weights = FolderWeights(arch, st, {n: names[n] for n in shapes})
    for name, shape in shapes.items():
        if weights.shape(name) != shape:
            raise ModelLoadError(f"{st.tensors[names[name]].file}: tensor {name} has shape "
                                 f"{list(weights.shape(name))}, config.json implies "
                                 f"{list(shape)}")
        st.check_range(names[name])
    return weights


def save_folder(folder: str | os.PathLike[str], arch: Architecture,
                weights: Mapping[str, np.ndarray], dtype: str = "float32") -> None:
    """Writes config.json and model.safetensors (each atomically), the weights in
    `dtype` ("float32", "float16" or "bfloat16", rounded to nearest even), under the
    names and orientation transformers reads."""
    from orion.atomic import atomic_write_bytes
    from orion.formats.safetensors import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    checked = check_arrays(arch, weights, "save_folder")
    stored = {n: (w.T if arch.stored_transposed(n) else w) for n, w in checked.items()}
    atomic_write_bytes(folder / "model.safetensors",
                       save(stored, dtype, metadata={"format": "pt"}))
    config = dict(arch.to_config(), torch_dtype=dtype)
    atomic_write_bytes(folder / "config.json", (json.dumps(config, indent=2) + "\n").encode())
