"""A program: one piece of a model that the device runs as a unit.

A `ProgramIR` is a graph whose inputs and outputs are the program's I/O, plus for each
of them an `IOSpec` that says how the model's tensor (its *source*) sits in the device
tensor the program declares. Partitioning makes programs; the program passes in
`orion.ir.legalize` rewrite them until every I/O is what the device binds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from orion.errors import InvalidArgumentError
from orion.ir.graph import Graph
from orion.ir.types import DType
from orion.runtime.fp16 import to_fp16, to_fp32


@dataclass(frozen=True)
class IOSpec:
    """One program input or output.

    name:    the MIL name (after `order_io_by_name`: in_00, out_00, ...)
    source:  the name of the model value it carries (a graph input, output, or a value
             passed between programs)
    shape, dtype: the model value's type
    device_shape: the tensor the program declares, [1, C', 1, S'] fp16 once legal
    block:   (C, S): the model value, folded to [C, S], occupies device[:C, :S];
             None until the layout pass has folded it
    """

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: DType
    device_shape: tuple[int, ...]
    block: tuple[int, int] | None = None

    @property
    def device_nbytes(self) -> int:
        n = 2
        for d in self.device_shape:
            n *= d
        return n


@dataclass
class ProgramIR:
    name: str
    graph: Graph
    inputs: list[IOSpec] = field(default_factory=list)
    outputs: list[IOSpec] = field(default_factory=list)

    def with_(self, graph: Graph, inputs: list[IOSpec], outputs: list[IOSpec]) -> ProgramIR:
        return replace(self, graph=graph, inputs=inputs, outputs=outputs)

    def spec(self, name: str) -> IOSpec:
        for s in self.inputs + self.outputs:
            if s.name == name:
                return s
        raise InvalidArgumentError(f"program {self.name} has no I/O {name!r}")


def program_from_graph(g: Graph, name: str | None = None) -> ProgramIR:
    """A whole graph as one program, its I/O carrying the graph's own names."""
    ins = [IOSpec(v.name, v.name, v.shape, v.dtype, v.shape) for v in g.inputs]
    outs = [IOSpec(k, k, v.shape, v.dtype, v.shape) for k, v in g.outputs.items()]
    return ProgramIR(name or g.name, g, ins, outs)


def to_device(spec: IOSpec, value: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The model value `value` placed in the device tensor of `spec` (fp16). Writes into
    `out` (e.g. a surface view of device_shape) when given; padding is left as it is there
    and zero in a new array."""
    if out is None:
        out = np.zeros(spec.device_shape, np.float16)
    arr = np.asarray(value)
    if arr.shape != spec.shape:
        raise InvalidArgumentError(f"{spec.source}: expected shape {spec.shape}, got {arr.shape}")
    if spec.block is None:
        if (arr.dtype == np.float32 and out.dtype == np.float16 and out.flags.c_contiguous
                and arr.size == out.size):
            to_fp16(arr, out=out)   # SIMD rounding: numpy's astype is ~10x slower
        else:
            out[...] = arr
    else:
        c, s = spec.block
        dev = out.reshape(spec.device_shape[1], spec.device_shape[3])
        whole_rows = s == dev.shape[1] and out.flags.c_contiguous
        if arr.dtype == np.float32 and out.dtype == np.float16:
            if whole_rows:   # the block is the first c*s elements: round straight in
                to_fp16(arr, out=out.reshape(-1)[:c * s])
                return out
            arr = to_fp16(arr)   # SIMD rounding first; the block copy is then fp16 rows
        dev[:c, :s] = arr.reshape(c, s)
    return out


def from_device(spec: IOSpec, device: np.ndarray, out: np.ndarray | None = None
                ) -> np.ndarray:
    """The model value of `spec` read out of its device tensor, as a float32 copy
    (written into `out`, a C-contiguous float32 array of the value's shape, when given:
    a caller that reads the same output every step then touches no fresh pages)."""
    dev = np.asarray(device)
    if out is not None and (out.shape != tuple(spec.shape) or out.dtype != np.float32
                            or not out.flags.c_contiguous):
        raise InvalidArgumentError(f"{spec.source}: out must be a C-contiguous float32 array of "
                                   f"shape {spec.shape}, not {out.dtype}{out.shape}")
    if spec.block is not None:
        c, s = spec.block
        rows = dev.reshape(spec.device_shape[1], spec.device_shape[3])
        # the block is the tensor's first c*s elements when its rows are whole rows
        dev = rows.reshape(-1)[:c * s] if s == rows.shape[1] else rows[:c, :s]
    if dev.dtype == np.float16:   # widened on SIMD kernels (fp16 rows gathered first)
        wide = to_fp32(np.ascontiguousarray(dev), out=out)
        return wide.reshape(spec.shape) if out is None else out
    if out is None:
        return dev.reshape(spec.shape).astype(np.float32)
    return copy_into(spec.source, out, dev.reshape(spec.shape))


def copy_into(name: str, out: np.ndarray, value: np.ndarray) -> np.ndarray:
    """`value` copied into a caller's `out` array of the same shape (no broadcasting:
    a wrong-shaped buffer is an error, not a silently filled one)."""
    if out.shape != value.shape:
        raise InvalidArgumentError(f"{name}: out has shape {out.shape}, the value {value.shape}")
    out[...] = value
    return out
