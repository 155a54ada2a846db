"""A palettized folder's tensors (what `orion convert --palettize` writes) under the
architecture's parameter names.

A palettized matrix `m.weight` [O, I] is stored as U8 codes `m.weight`, its tables
`m.lut` and its per-channel scales `m.channel_scale` (orion.formats.palettize), always
[out, in] whatever the architecture's files otherwise store; everything else is stored
as in a Hugging Face folder. The layers' linear weights, the embedding and the
classifier may be palettized (an embedding's rows are decoded on the host, a row per
token). `open_palettized_folder` checks the folder whole before anything is
allocated: every parameter present once, each palettized matrix's three tensors of
the shapes its spec implies (its tables' count a choice of channels a table),
tables and scales finite, and every value a table and a scale make within fp16's
range.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.formats import palettize as PL
from orion.formats.safetensors import FP16_MAX, SafetensorsFolder
from orion.ir.quant import QuantTensor
from orion.models.architecture import Architecture
from orion.models.weights import FolderWeights, Rows, parameter_files

PARTS = ("lut", "channel_scale")


@dataclass(frozen=True)
class PaletteModule:
    """One palettized matrix of the folder (names as the files hold them)."""

    codes: str
    lut: str
    scale: str
    shape: tuple[int, int]   # [out, in]
    group: int               # output channels a table


class PalettizedWeights:
    """The WeightSource of a checked palettized folder (see the module docstring): the
    palettized matrices here, the rest through `FolderWeights`."""

    def __init__(self, arch: Architecture, st: SafetensorsFolder, spec: PL.PaletteSpec,
                 plain: dict[str, str], pal: dict[str, PaletteModule]) -> None:
        self.arch, self.st, self.spec = arch, st, spec
        self.plain = FolderWeights(arch, st, plain)
        self.palettized = pal       # parameter name -> its module

    def names(self) -> list[str]:
        return [*self.plain.names(), *self.palettized]

    def shape(self, name: str) -> tuple[int, ...]:
        m = self.palettized.get(name)
        return m.shape if m is not None else self.plain.shape(name)

    def quant(self, name: str, rows: slice | None = None) -> QuantTensor | None:
        """The LUT the device expands (of a run of rows whole tables: `rows`), with the
        per-channel scale as its post_scale."""
        m = self.palettized.get(name)
        if m is None:
            return None
        lo, hi, _ = (rows or slice(None)).indices(m.shape[0])
        if lo % m.group or (hi % m.group and hi != m.shape[0]):
            raise InvalidArgumentError(f"rows {lo}:{hi} of {name} cut its tables of "
                                       f"{m.group} channels")
        try:
            lut = np.array(self.st.raw(m.lut)[lo // m.group: -(-hi // m.group)],
                           np.float16).reshape(-1, 1, 1 << self.spec.bits, 1)
            codes = np.array(self.st.raw(m.codes)[lo:hi]).reshape(-1)
            return QuantTensor("lut", (hi - lo, m.shape[1]), codes, f"uint{self.spec.bits}",
                               lut=lut,
                               post_scale=np.array(self.st.raw(m.scale)[lo:hi], np.float16))
        finally:
            self.st.close()

    def _rows(self, m: PaletteModule, rows: Rows) -> np.ndarray:
        """fp16 rows of a palettized matrix, only theirs decoded: a run by mapping, an
        embedding's ids by reading."""
        if rows is None or isinstance(rows, slice):
            ids = np.arange(m.shape[0])[rows if rows is not None else slice(None)]
            pick = rows if rows is not None else slice(None)
            codes, scale = self.st.raw(m.codes)[pick], self.st.raw(m.scale)[pick]
            return PL.dense_fp16(codes, self.st.fp32(m.lut), scale, self.spec.bits, m.group,
                                 ids)
        # a decode step's embedding rows: only their codes, scales and tables are read
        ids = np.asarray(rows, np.int64).reshape(-1)
        tables, at = np.unique(ids // m.group, return_inverse=True)
        lut = self.st.read_rows_fp32(m.lut, tables)
        return PL.dense_fp16(self.st.read_rows(m.codes, ids), lut,
                             self.st.read_rows(m.scale, ids), self.spec.bits, 1,
                             at.reshape(-1))

    def fp16(self, name: str, rows: Rows = None) -> np.ndarray:
        m = self.palettized.get(name)
        if m is None:
            return self.plain.fp16(name, rows)
        try:
            return self._rows(m, rows)
        finally:
            self.st.close()

    def fp32(self, name: str, rows: Rows = None) -> np.ndarray:
        if name in self.palettized:
            return self.fp16(name, rows).astype(np.float32)
        return self.plain.fp32(name, rows)

    def rows_fp32(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        m = self.palettized.get(name)
        if m is None:
            return self.plain.rows_fp32(name, ids)
        return self._rows(m, ids).astype(np.float32)

    def parameter_count(self) -> int:
        return sum(int(np.prod(self.shape(n))) for n in self.names())

    def fingerprint(self) -> str:
        """The files' identity and headers and how each parameter is read from them."""
        layout = repr((self.spec, sorted(self.palettized.items()))).encode()
        return hashlib.sha256(self.plain.fingerprint().encode() + layout).hexdigest()

    def close(self) -> None:
        self.st.close()


def palettizable(arch: Architecture) -> set[str]:
    """The parameters a palettized folder may hold palettized (and `orion convert
    --palettize` palettizes): the layers' linear weights, the embedding, the classifier."""
    return {arch.layer_prefix(i) + f"{m}.weight" for i in range(arch.args.n_layers)
            for m in arch.linear_modules()} | {arch.embed_name, arch.classifier_name}


def _check_module(st: SafetensorsFolder, fname: str, spec: PL.PaletteSpec,
                  shape: tuple[int, ...], folder: Path) -> PaletteModule:
    module = fname[: -len(".weight")]
    lut, scale = (f"{module}.{k}" for k in PARTS)
    if not spec.fits(shape):
        raise ModelLoadError(f"{folder}: {module} is palettized but its parameter has shape "
                             f"{list(shape)}: not a matrix with rows of whole bytes at "
                             f"{spec.bits} bits")
    if scale not in st:
        raise ModelLoadError(f"{folder}: {module} has a lut but no channel_scale")
    rows, cols = shape
    tables = st.tensors[lut].shape[0] if st.tensors[lut].shape else 0
    group = rows // tables if tables and rows % tables == 0 else 0
    if group not in PL.GROUP_CHANNELS or group > spec.group_channels:
        choices = ", ".join(str(g) for g in PL.GROUP_CHANNELS if g <= spec.group_channels)
        raise ModelLoadError(f"{st.tensors[lut].file}: tensor {lut} has {tables} tables for "
                             f"{rows} channels; a table serves one of {choices} channels")
    want = {fname: ((rows, spec.row_bytes(cols)), "U8"),
            lut: ((tables, 1 << spec.bits), "F16"),
            scale: ((rows,), "F16")}
    for name, (wshape, dtype) in want.items():
        info = st.tensors[name]
        if info.shape != wshape or info.dtype != dtype:
            raise ModelLoadError(f"{info.file}: tensor {name} is {info.dtype} "
                                 f"{list(info.shape)}; a {list(shape)} matrix palettized at "
                                 f"{spec.bits} bits in groups of {group} channels needs "
                                 f"{dtype} {list(wshape)}")
    st.check_range(lut)
    st.check_range(scale)
    peak = np.abs(st.fp32(lut)).max(axis=1)
    worst = np.abs(st.fp32(scale)).reshape(-1, group).max(axis=1) * peak
    if worst.size and float(worst.max()) > FP16_MAX:
        raise ModelLoadError(f"{folder}: {module} has values outside fp16's range "
                             "(|lut value * channel_scale| > 65504)")
    return PaletteModule(fname, lut, scale, (rows, cols), group)


def open_palettized_folder(arch: Architecture, folder: Path, spec: PL.PaletteSpec
                           ) -> PalettizedWeights:
    """The folder's tensors checked whole against `arch` (see the module docstring)."""
    st = SafetensorsFolder(folder)
    shapes = arch.parameters()
    files = [n for n in st if not arch.ignored_tensors(n)]
    parts = {n for n in files if n.endswith(tuple(f".{k}" for k in PARTS))}
    modules = {n.rsplit(".", 1)[0] for n in parts}
    hf = parameter_files(arch, [n for n in files if n not in parts], folder)
    matrices = palettizable(arch)
    plain: dict[str, str] = {}
    pal: dict[str, PaletteModule] = {}
    claimed: set[str] = set()
    for name, shape in shapes.items():
        fname = hf[name]
        module = fname[: -len(".weight")] if fname.endswith(".weight") else ""
        if module in modules:
            if name not in matrices:
                raise ModelLoadError(f"{folder}: {module} is palettized; only the layers' "
                                     "linear weights, the embedding and the classifier "
                                     "may be")
            pal[name] = _check_module(st, fname, spec, shape, folder)
            claimed.add(module)
            continue
        stored = shape[::-1] if arch.stored_transposed(name) else shape
        if st.shape(fname) != stored:
            raise ModelLoadError(f"{st.tensors[fname].file}: tensor {fname} has shape "
                                 f"{list(st.shape(fname))}, config.json implies {list(stored)}")
        st.check_range(fname)
        plain[name] = fname
    stray = sorted(modules - claimed)
    if stray:
        raise ModelLoadError(f"{folder}: {stray[0]}.lut belongs to no parameter of the model")
    st.close()   # the pages the checks read leave the RSS (as open_mlx_folder)
    return PalettizedWeights(arch, st, spec, plain, pal)
