"""An MLX quantized folder's tensors (what `mlx_lm.convert -q` writes) under the
architecture's parameter names.

A quantized module `m` holds `m.weight` (uint32 codes), `m.scales` and `m.biases`
(orion.formats.mlx_quant); everything else (norms, biases, unquantized layers) is
stored as in a Hugging Face folder. mlx-lm saves its models' names: the same as
transformers' for the Llama family; GPT-2's under "model." with every linear weight
[out, in]. `open_mlx_folder` checks the folder whole before anything is allocated:
every parameter present once, each quantized module's three tensors of the shapes its
spec implies, scales and biases finite and within fp16's range, and every dequantized
value within it too (|s| (2^bits - 1) + |b| <= 65504).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orion.errors import ModelLoadError
from orion.formats import mlx_quant as MQ
from orion.formats.safetensors import FP16_MAX, SafetensorsFolder
from orion.ir.quant import QuantTensor
from orion.models.architecture import Architecture
from orion.models.quantized import mlx_tensor
from orion.models.weights import Rows, parameter_files

ROWS_AT_ONCE = 4096          # rows dequantized at a time (bounded temporaries)
# mlx-lm's name of a file tensor -> transformers' (what the architecture file knows)
_RENAME = {"gpt2": ("model.", "transformer.")}


@dataclass(frozen=True)
class QuantModule:
    """One quantized matrix of the folder."""

    spec: MQ.QuantSpec
    weight: str             # the names in the files
    scales: str
    biases: str
    dtype: str              # the scales' safetensors dtype: F16, BF16 or F32
    shape: tuple[int, int]  # [out, in]


def _hf_name(arch: Architecture, name: str) -> str:
    old, new = _RENAME.get(arch.model_type, ("", ""))
    return new + name[len(old):] if old and name.startswith(old) else name


class MLXWeights:
    """The WeightSource of a checked MLX folder (see `open_mlx_folder`)."""

    def __init__(self, arch: Architecture, st: SafetensorsFolder, plain: dict[str, str],
                 quant: dict[str, QuantModule]) -> None:
        self.arch, self.st = arch, st
        self.plain = plain        # parameter name -> file name (stored as is)
        self.quantized = quant    # parameter name -> its module

    def names(self) -> list[str]:
        return [*self.plain, *self.quantized]

    def shape(self, name: str) -> tuple[int, ...]:
        q = self.quantized.get(name)
        return q.shape if q is not None else self.st.shape(self.plain[name])

    def module(self, name: str) -> QuantModule | None:
        """The quantization of a parameter (None: stored as floats)."""
        return self.quantized.get(name)

    def quant(self, name: str, rows: slice | None = None) -> QuantTensor | None:
        """The parameter (or a run of its rows) as the device holds it compressed (None:
        stored as floats)."""
        q = self.quantized.get(name)
        if q is None:
            return None
        lo, hi, _ = (rows or slice(None)).indices(q.shape[0])
        pick = slice(lo, hi)
        try:
            return mlx_tensor(self.st.raw(q.weight)[pick], self.st.fp32(q.scales, pick),
                              self.st.fp32(q.biases, pick), q.spec, q.dtype,
                              (hi - lo, q.shape[1]))
        finally:
            self.st.close()

    def _dequant(self, q: QuantModule, rows: Rows) -> np.ndarray:
        """fp16 [rows, in]: `mlx.core.dequantize`'s values, rounded once to fp16."""
        words = self.st.raw(q.weight)
        idx = np.arange(q.shape[0])[rows if rows is not None else slice(None)]
        out = np.empty((idx.size, q.shape[1]), np.float16)
        for lo in range(0, idx.size, ROWS_AT_ONCE):
            part = idx[lo: lo + ROWS_AT_ONCE]
            contiguous = part.size and part[-1] - part[0] + 1 == part.size
            pick = slice(int(part[0]), int(part[-1]) + 1) if contiguous else part
            codes = MQ.unpack(np.asarray(words[pick]), q.spec.bits, q.shape[1])
            out[lo: lo + part.size] = MQ.dequantize_fp16(
                codes, self.st.fp32(q.scales, pick), self.st.fp32(q.biases, pick),
                q.spec.group_size, q.dtype)
        return out

    def fp16(self, name: str, rows: Rows = None) -> np.ndarray:
        try:
            q = self.quantized.get(name)
            if q is not None:
                return self._dequant(q, rows)
            return self.st.fp16(self.plain[name], rows)
        finally:
            self.st.close()

    def fp32(self, name: str, rows: Rows = None) -> np.ndarray:
        if name in self.quantized:
            return self.fp16(name, rows).astype(np.float32)
        try:
            return self.st.fp32(self.plain[name], rows)
        finally:
            self.st.close()

    def rows_fp32(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        q = self.quantized.get(name)
        if q is None:
            return self.st.read_rows_fp32(self.plain[name], ids)
        # read, not mapped (as FolderWeights does): a map and unmap per decode step
        # cost ~0.4 ms a token; only the rows' codes, scales and biases are read
        codes = MQ.unpack(self.st.read_rows(q.weight, ids), q.spec.bits, q.shape[1])
        return MQ.dequantize_fp16(
            codes, self.st.read_rows_fp32(q.scales, ids), self.st.read_rows_fp32(q.biases, ids),
            q.spec.group_size, q.dtype).astype(np.float32)

    def parameter_count(self) -> int:
        return sum(int(np.prod(self.shape(n))) for n in self.names())

    def fingerprint(self) -> str:
        """The files' identity and headers and how each parameter is read from them
        (its quantization included): no tensor is read."""
        layout = repr((sorted(self.plain.items()), sorted(self.quantized.items()))).encode()
        return hashlib.sha256(self.st.fingerprint().encode() + layout).hexdigest()

    def close(self) -> None:
        self.st.close()


def _check_module(st: SafetensorsFolder, module: str, spec: MQ.QuantSpec,
                  shape: tuple[int, ...], folder: Path) -> QuantModule:
    w, s, b = (f"{module}.{k}" for k in ("weight", "scales", "biases"))
    if len(shape) != 2:
        raise ModelLoadError(f"{folder}: {module} is quantized but its parameter has shape "
                             f"{list(shape)}, not a matrix")
    rows, cols = shape
    if cols % spec.group_size:
        raise ModelLoadError(f"{folder}: {module} has {cols} inputs, not whole groups of "
                             f"{spec.group_size}")
    if b not in st:
        raise ModelLoadError(f"{folder}: {module} has scales but no biases (only MLX's "
                             "affine quantization is supported)")
    want = {w: ((rows, spec.words(cols)), ("U32",)),
            s: ((rows, cols // spec.group_size), MQ.SCALE_DTYPES),
            b: ((rows, cols // spec.group_size), MQ.SCALE_DTYPES)}
    for name, (wshape, dtypes) in want.items():
        info = st.tensors[name]
        if info.shape != wshape or info.dtype not in dtypes:
            raise ModelLoadError(f"{info.file}: tensor {name} is {info.dtype} "
                                 f"{list(info.shape)}; {spec.bits}-bit groups of "
                                 f"{spec.group_size} of a {list(shape)} matrix need "
                                 f"{'/'.join(dtypes)} {list(wshape)}")
    if st.tensors[s].dtype != st.tensors[b].dtype:
        raise ModelLoadError(f"{folder}: {s} and {b} differ in dtype")
    st.check_range(s)
    st.check_range(b)
    worst = np.abs(st.fp32(s)) * ((1 << spec.bits) - 1) + np.abs(st.fp32(b))
    if worst.size and float(worst.max()) > FP16_MAX:
        raise ModelLoadError(f"{folder}: {module} dequantizes to values outside fp16's "
                             "range (|x| > 65504), which the device's fp16 cannot hold")
    return QuantModule(spec, w, s, b, st.tensors[s].dtype, (rows, cols))


def open_mlx_folder(arch: Architecture, folder: Path, qcfg: MQ.QuantConfig) -> MLXWeights:
    """The folder's tensors checked whole against `arch` (see the module docstring)."""
    st = SafetensorsFolder(folder)
    shapes = arch.parameters()
    files = [n for n in st if not arch.ignored_tensors(n)]
    modules = {n[: -len(".scales")] for n in files if n.endswith(".scales")}
    parts = {f"{m}.{k}" for m in modules for k in ("scales", "biases")}
    plain: dict[str, str] = {}
    quant: dict[str, QuantModule] = {}
    hf = parameter_files(arch, [_hf_name(arch, n) for n in files if n not in parts], folder)
    by_hf = {_hf_name(arch, n): n for n in files if n not in parts}
    for name, shape in shapes.items():
        fname = by_hf[hf[name]]
        module = fname[: -len(".weight")] if fname.endswith(".weight") else ""
        if module in modules:
            spec = qcfg.spec(module)
            if spec is None:
                raise ModelLoadError(f"{folder}: {module} has scales, but config.json's "
                                     "quantization says it is not quantized")
            quant[name] = _check_module(st, module, spec, shape, folder)
            continue
        if st.shape(fname) != shape:
            raise ModelLoadError(f"{st.tensors[fname].file}: tensor {fname} has shape "
                                 f"{list(st.shape(fname))}, config.json implies {list(shape)}")
        st.check_range(fname)
        plain[name] = fname
    # the checks read every scale and bias through the shared mapping (36 MiB of the
    # Qwen3-0.6B shape at 4 bits): unmapped, those pages leave the RSS
    st.close()
    return MLXWeights(arch, st, plain, quant)
