"""LoRA adapters as the runtime feeds them: an adapter's matrices per (layer, module)
of one architecture, the set a model holds, and how they enter the programs.

    adapter = load_adapter("out/adapter", arch)    # PEFT's folder (orion.formats.peft)
    adapters = AdapterSet(arch); adapters.add(adapter, "chat"); adapters.select("chat")

A module is a linear layer's path within its layer ("self_attn.q_proj", GPT-2's
"attn.c_attn"), as `Architecture.linear_modules` lists them; its full name (what PEFT's
target_modules and patterns match, and what its tensors are named by) adds the layer's
prefix. Programs are compiled per `Signature` (the adapted modules and their program
ranks): selecting another adapter of a signature seen before writes surfaces only.

Every value is checked at load: finite, and the merged change s B A within fp16's range
(the device computes in fp16; an adapter that would overflow it is refused by name,
never served as inf or NaN).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from orion.errors import LoraError
from orion.formats.peft import LoraConfig, read_adapter, tensor_name, write_adapter
from orion.ir.graph import Graph, Value
from orion.models.architecture import Architecture

FP16_MAX = 65504.0
Key = tuple[int, str]                    # (layer, module path)
Signature = tuple[tuple[str, int], ...]  # ((module path, program rank), ...)


@dataclass
class Adapter:
    """A LoRA adapter for one model: `matrices[(layer, module)] = (A, B)`, fp32."""

    config: LoraConfig
    arch: Architecture
    matrices: dict[Key, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def full_name(self, layer: int, module: str) -> str:
        return self.arch.layer_prefix(layer) + module

    def modules(self) -> tuple[str, ...]:
        """The architecture's linear modules this adapter targets, in the model's order."""
        found = tuple(m for m in self.arch.linear_modules()
                      if self.config.adapts(self.full_name(0, m)))
        if not found:
            raise LoraError(f"target_modules {list(self.config.targets)} match no linear "
                            f"layer of this {self.arch.model_type} model (its layers have "
                            f"{', '.join(self.arch.linear_modules())})")
        return found

    def keys(self) -> Iterator[Key]:
        mods = self.modules()
        for layer in range(self.arch.args.n_layers):
            for module in mods:
                yield layer, module

    def rank(self, layer: int, module: str) -> int:
        return self.config.rank(self.full_name(layer, module))

    def scale(self, layer: int, module: str) -> float:
        return self.config.scale(self.full_name(layer, module))

    def tensor(self, layer: int, module: str, which: str) -> str:
        return tensor_name(self.full_name(layer, module), which)

    def check(self, where: str) -> None:
        """Every targeted (layer, module) present with the shapes the model implies, and
        its change to the weights finite and within fp16's range."""
        expected = set(self.keys())
        for layer, module in sorted(expected):
            if (layer, module) not in self.matrices:
                raise LoraError(f"{where}: no {self.tensor(layer, module, 'A')}")
            a, b = self.matrices[layer, module]
            out, inp = self.arch.module_shape(module, layer)
            r = self.rank(layer, module)
            for name, arr, shape in (("A", a, (r, inp)), ("B", b, (out, r))):
                if arr.shape != shape:
                    raise LoraError(
                        f"{where}: {self.tensor(layer, module, name)} has shape "
                        f"{list(arr.shape)}; this {self.arch.model_type} base's {module} "
                        f"is [{out}, {inp}] and the config gives rank {r}, so "
                        f"{list(shape)} (made for another base{_base_named(self.config)}?)")
            self._check_values(layer, module, where)
        extra = set(self.matrices) - expected
        if extra:
            raise LoraError(f"{where}: matrices for modules the config does not target: "
                            f"{sorted(extra)[:3]}")

    def _check_values(self, layer: int, module: str, where: str) -> None:
        a, b = self.matrices[layer, module]
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise LoraError(f"{where}: {self.full_name(layer, module)} holds a value that is "
                            "not finite")
        s = self.scale(layer, module)
        if not np.isfinite(s) or s == 0:
            raise LoraError(f"{where}: the scale of {self.full_name(layer, module)} is {s}")
        # |s B A| entrywise is at most |s| * max_i sum_r |B_ir| * max_r,j |A_rj|: a bound
        # with no [out, in] product formed; the product itself only when the bound fails
        bound = abs(s) * float(np.abs(b).sum(axis=1).max(initial=0.0)) \
            * float(np.abs(a).max(initial=0.0))
        if bound > FP16_MAX and float(np.abs(self.delta(layer, module)).max()) > FP16_MAX:
            raise LoraError(f"{where}: {self.full_name(layer, module)} changes a weight by "
                            "more than fp16's range (65504): its values or lora_alpha are "
                            "far outside what training gives")
        for name, m in (("A", a), ("B", b), ("s B", s * b)):
            if float(np.abs(m).max(initial=0.0)) > FP16_MAX:
                raise LoraError(f"{where}: {self.full_name(layer, module)}'s {name} has a "
                                "value outside fp16's range (65504), which the device "
                                "cannot hold")

    def delta(self, layer: int, module: str) -> np.ndarray:
        """s B A, the [out, in] change of the module's weight."""
        a, b = self.matrices[layer, module]
        return np.float32(self.scale(layer, module)) * (b @ a)

    def merged(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The base weights with this adapter added to them (PEFT's merge_and_unload)."""
        out = dict(weights)
        for layer, module in self.keys():
            key = f"{self.full_name(layer, module)}.weight"
            out[key] = (np.asarray(weights[key], np.float32) + self.delta(layer, module)
                        ).astype(np.float32)
        return out

    def params(self) -> dict[str, np.ndarray]:
        """The matrices under their PEFT tensor names (views, for an optimizer)."""
        out: dict[str, np.ndarray] = {}
        for (layer, module), (a, b) in self.matrices.items():
            out[self.tensor(layer, module, "A")] = a
            out[self.tensor(layer, module, "B")] = b
        return out


def init_adapter(config: LoraConfig, arch: Architecture, seed: int = 0) -> Adapter:
    """PEFT's default initialization: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform
    with a = sqrt(5)), B = 0, so training starts from the base model exactly."""
    rng = np.random.default_rng(seed)
    ad = Adapter(config, arch)
    for layer, module in ad.keys():
        out, inp = arch.module_shape(module, layer)
        r = ad.rank(layer, module)
        bound = 1.0 / np.sqrt(inp)
        ad.matrices[layer, module] = (
            rng.uniform(-bound, bound, (r, inp)).astype(np.float32),
            np.zeros((out, r), np.float32))
    return ad


def load_adapter(folder: str | os.PathLike[str], arch: Architecture) -> Adapter:
    """A PEFT adapter folder for a model of this architecture, checked whole."""
    config, tensors = read_adapter(folder)
    where = os.fspath(folder)
    _check_layer_count(config, tensors, arch, where)
    ad = Adapter(config, arch)
    names = set(tensors)
    for layer, module in ad.keys():
        na, nb = ad.tensor(layer, module, "A"), ad.tensor(layer, module, "B")
        if na not in tensors or nb not in tensors:
            raise _missing(config, tensors, arch, layer, na if na not in tensors else nb,
                           where)
        ad.matrices[layer, module] = (tensors[na], tensors[nb])
        names -= {na, nb}
    if names:
        raise LoraError(f"{where}: tensors the config does not explain: {sorted(names)[:3]}")
    ad.check(where)
    return ad


_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")   # model.layers.N. (GPT-2: transformer.h.N.)


def _base_named(config: LoraConfig) -> str:
    return f" ({config.base_model})" if config.base_model else ""


def _adapter_layers(tensors: Mapping[str, np.ndarray]) -> int:
    """How many layers the adapter's tensors reach (0: none named by layer)."""
    return max((int(m.group(1)) + 1 for n in tensors if (m := _LAYER.search(n))), default=0)


def _check_layer_count(config: LoraConfig, tensors: Mapping[str, np.ndarray],
                       arch: Architecture, where: str) -> None:
    """An adapter made for a deeper base, said in the base's terms (its tensor names
    alone would only say that one is unexplained)."""
    reach = _adapter_layers(tensors)
    if reach > arch.args.n_layers:
        raise LoraError(f"{where}: made for a base of at least {reach} layers"
                        f"{_base_named(config)}; this {arch.model_type} model has "
                        f"{arch.args.n_layers}")


def _missing(config: LoraConfig, tensors: Mapping[str, np.ndarray], arch: Architecture,
             layer: int, name: str, where: str) -> LoraError:
    reach = _adapter_layers(tensors)
    if 0 < reach <= layer:   # the config targets this layer; the tensors stop before it
        return LoraError(f"{where}: made for a {reach}-layer base{_base_named(config)}; "
                         f"this {arch.model_type} model has {arch.args.n_layers} layers "
                         f"(no {name})")
    return LoraError(f"{where}: no {name} (made for another base model"
                     f"{_base_named(config)}?)")


def save_adapter(folder: str | os.PathLike[str], adapter: Adapter) -> None:
    write_adapter(folder, adapter.config, adapter.params())


def signature(adapter: Adapter | None) -> Signature:
    """The program signature an adapter needs (() for none: the base programs)."""
    if adapter is None:
        return ()
    return tuple((m, max(adapter.rank(i, m) for i in range(adapter.arch.args.n_layers)))
                 for m in adapter.modules())


class AdapterSet:
    """The adapters a loaded model holds, and which one its programs compute with
    (None: the base model, the programs it runs without LoRA)."""

    def __init__(self, arch: Architecture) -> None:
        self.arch = arch
        self.adapters: dict[str, Adapter] = {}
        self.active: str | None = None

    def load(self, path: str | os.PathLike[str], name: str = "default") -> Adapter:
        return self.add(load_adapter(path, self.arch), name)

    def add(self, adapter: Adapter, name: str = "default") -> Adapter:
        """Adds (or replaces) an adapter."""
        if adapter.arch != self.arch:
            raise LoraError(f"adapter {name!r} is for another model configuration")
        adapter.check(f"adapter {name!r}")
        self.adapters[name] = adapter
        return adapter

    def select(self, name: str | None) -> None:
        if name is not None:
            self.get(name)
        self.active = name

    def get(self, name: str) -> Adapter:
        """The adapter loaded as `name`; LoraError naming those loaded otherwise."""
        if name not in self.adapters:
            raise LoraError(f"no adapter named {name!r} (loaded: {sorted(self.adapters)})")
        return self.adapters[name]

    @property
    def selected(self) -> Adapter | None:
        return None if self.active is None else self.adapters[self.active]

    @property
    def signature(self) -> Signature:
        return signature(self.selected)


# ---- the inputs of the inference programs ------------------------------------------


@dataclass(frozen=True)
class _Slot:
    """Where rank rows [first, first + rank) of one [R, size] matrix lie: rows
    [row, row + rank * fold) of input `lora<chunk>`, each rank row folded into `fold`
    surface rows."""

    module: str
    which: str    # "a" (A) or "b" (B'^T)
    first: int
    rank: int
    size: int
    chunk: int
    row: int
    fold: int

    @property
    def rows(self) -> int:
        return self.rank * self.fold


@dataclass(frozen=True)
class KvLora:
    """What a KV-cache layer program is compiled for: the adapted modules and their
    program ranks, and the surface grid its LoRA inputs are folded into.

    Those programs bind zero-copy surfaces of one uniform size in declared order
    (ANE-C18, ANE-C20), every one a grid of rows of one width W: the decode row width,
    or the prefill bucket S. So each adapted module's A [R, in] and B'^T = (s B)^T
    [R, out] are folded into rows of W (a rank row takes ceil(n / W) surface rows, the
    tail zero), and stacked into inputs `lora0`, `lora1`, ... of at most `capacity`
    rows, the rows of the program's other inputs, so the uniform size does not grow.
    A module whose matrices take more rows than that is cut into rank pieces, each
    in an input of its own, and its term is the sum of the pieces' terms. An adapter
    of lower rank than the program's is zero-padded: B'A is unchanged, and every
    padded product is an exact zero."""

    ranks: Signature
    width: int
    capacity: int

    def slots(self, arch: Architecture) -> list[_Slot]:
        out: list[_Slot] = []
        chunk = used = 0
        for module, rank in self.ranks:
            sizes = arch.module_shape(module)[::-1]          # A: in, B'^T: out
            folds = [-(-size // self.width) for size in sizes]
            per = min(self.capacity // f for f in folds)     # rank rows a piece holds
            if per < 1:
                raise LoraError(f"{module} needs {max(folds)} surface rows of {self.width} "
                                f"for one rank; the program's surfaces hold "
                                f"{self.capacity} (use larger buckets)")
            for first in range(0, rank, per):
                r = min(per, rank - first)
                for which, size, fold in zip("ab", sizes, folds, strict=True):
                    if used + r * fold > self.capacity:
                        chunk, used = chunk + 1, 0
                    out.append(_Slot(module, which, first, r, size, chunk, used, fold))
                    used += r * fold
        return out

    def chunk_rows(self, arch: Architecture) -> list[int]:
        rows: dict[int, int] = {}
        for s in self.slots(arch):
            rows[s.chunk] = s.row + s.rows
        return [rows[c] for c in sorted(rows)]

    def declare(self, g: Graph, arch: Architecture, prefix: str = ""
                ) -> dict[str, list[tuple[Value, Value]]]:
        """Declares the inputs `<prefix>lora0`, ... (right after the program's other
        inputs: the declared order is the binding order) and returns module -> its
        rank pieces (A [1, 1, r, in], B'^T [1, 1, r, out]), in rank order."""
        chunks = [g.input(f"{prefix}lora{c}", (1, rows, 1, self.width))
                  for c, rows in enumerate(self.chunk_rows(arch))]
        mats: dict[tuple[str, int, str], Value] = {}
        for s in self.slots(arch):
            piece = f"_r{s.first}" if s.first else ""
            name = f"{prefix}lora_{s.which}_{s.module.replace('.', '_')}{piece}"
            with g.scope(name):
                v = g.slice(chunks[s.chunk], (0, s.row, 0, 0), (1, s.rows, 1, self.width),
                            name="rows")
                v = g.reshape(v, (1, 1, s.rank, s.fold * self.width), name="unfold")
                if s.fold * self.width != s.size:
                    v = g.slice(v, (0, 0, 0, 0), (1, 1, s.rank, s.size), name="cut")
            mats[s.module, s.first, s.which] = v
        out: dict[str, list[tuple[Value, Value]]] = {m: [] for m, _ in self.ranks}
        for (module, first, which), v in mats.items():
            if which == "a":
                out[module].append((v, mats[module, first, "b"]))
        return out

    def pack(self, adapter: Adapter, layer: int) -> list[np.ndarray]:
        """One layer's inputs, fp16 [rows, width] per chunk."""
        arch = adapter.arch
        out = [np.zeros((rows, self.width), np.float16) for rows in self.chunk_rows(arch)]
        for s in self.slots(arch):
            m = packed_matrix(adapter, layer, s.module, s.which)[s.first: s.first + s.rank]
            folded = np.zeros((s.rank, s.fold * self.width), np.float16)
            folded[: m.shape[0], : s.size] = m
            out[s.chunk][s.row: s.row + s.rows] = folded.reshape(s.rows, self.width)
        return out


@dataclass(frozen=True)
class BatchLora:
    """The LoRA inputs of a batch program (`orion.models.batch_programs`): `per_row`'s
    grid once for each of the `rows` rows, row b's block after row b-1's, so that each
    row computes with its own adapter (Punica's and S-LoRA's per-row adapters): input
    `lora<c>` is [1, rows * R_c, 1, W]. A row without an adapter, or an adapter without
    a module or with a lower rank than the signature's, holds zeros there: its term is
    an exact zero."""

    per_row: KvLora
    rows: int

    def chunk_rows(self, arch: Architecture) -> list[int]:
        return [self.rows * r for r in self.per_row.chunk_rows(arch)]

    def declare(self, g: Graph, arch: Architecture, prefix: str = ""
                ) -> dict[str, list[tuple[Value, Value]]]:
        """`KvLora.declare` with the row as the leading axis: module -> its rank pieces
        (A [B, 1, r, in], B'^T [B, 1, r, out])."""
        width, b = self.per_row.width, self.rows
        per = self.per_row.chunk_rows(arch)
        chunks = [g.input(f"{prefix}lora{c}", (1, b * rows, 1, width))
                  for c, rows in enumerate(per)]
        mats: dict[tuple[str, int, str], Value] = {}
        for s in self.per_row.slots(arch):
            piece = f"_r{s.first}" if s.first else ""
            name = f"{prefix}lora_{s.which}_{s.module.replace('.', '_')}{piece}"
            with g.scope(name):
                v = g.reshape(chunks[s.chunk], (b, per[s.chunk], 1, width), name="per_row")
                v = g.slice(v, (0, s.row, 0, 0), (b, s.rows, 1, width), name="rows")
                v = g.reshape(v, (b, 1, s.rank, s.fold * width), name="unfold")
                if s.fold * width != s.size:
                    v = g.slice(v, (0, 0, 0, 0), (b, 1, s.rank, s.size), name="cut")
            mats[s.module, s.first, s.which] = v
        out: dict[str, list[tuple[Value, Value]]] = {m: [] for m, _ in self.per_row.ranks}
        for (module, first, which), v in mats.items():
            if which == "a":
                out[module].append((v, mats[module, first, "b"]))
        return out

    def pack(self, adapters: list[Adapter | None], layer: int) -> list[np.ndarray]:
        """One layer's inputs for the rows' adapters (row b: adapters[b]), fp16
        [rows * R_c, W] per chunk."""
        arch = next(a.arch for a in adapters if a is not None) if any(adapters) else None
        width = self.per_row.width
        if arch is None:
            raise LoraError("pack needs at least one adapter")
        per = self.per_row.chunk_rows(arch)
        out = [np.zeros((self.rows * r, width), np.float16) for r in per]
        for b, adapter in enumerate(adapters):
            if adapter is None:
                continue
            for s in self.per_row.slots(arch):
                if (layer, s.module) not in adapter.matrices:
                    continue
                m = packed_matrix(adapter, layer, s.module, s.which)[s.first: s.first + s.rank]
                folded = np.zeros((s.rank, s.fold * width), np.float16)
                folded[: m.shape[0], : s.size] = m
                at = b * per[s.chunk] + s.row
                out[s.chunk][at: at + s.rows] = folded.reshape(s.rows, width)
        return out


def packed_matrix(adapter: Adapter, layer: int, module: str, which: str) -> np.ndarray:
    """A [r, in] ("a") or B'^T = (s B)^T [r, out] ("b"), fp16: what the programs read."""
    a, b = adapter.matrices[layer, module]
    if which == "a":
        return a.astype(np.float16)
    return (np.float32(adapter.scale(layer, module)) * b).T.astype(np.float16)
