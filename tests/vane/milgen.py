"""A tiny MIL text emitter for the vane tests (the real compiler is orion.ir).

Every op argument becomes a named const, as the device requires (ANE-C04).
`wrap_input` / `wrap_output` let a test use any tensor shape inside a program
whose I/O obeys the device's rules: rank 4 [1, C, 1, S] fp16, S = 32, at
least 49152 bytes per tensor (ANE-C22, ANE-C23).
"""

from __future__ import annotations

import math

import numpy as np

HEADER = (
    "program(1.3)\n"
    '[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, '
    '{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, '
    '{"coremltools-version", "9.0"}})]\n'
)
IO_SEQ = 32
MIN_IO_ELEMS = 49152 // 2


def type_str(shape: tuple[int, ...] | None, dtype: str = "fp16") -> str:
    if shape is None:
        return dtype
    return f"tensor<{dtype}, [{', '.join(str(int(d)) for d in shape)}]>"


def _num(x: float, dtype: str) -> str:
    if dtype == "bool":
        return "true" if x else "false"
    if dtype in ("int32", "uint64"):
        return str(int(x))
    if math.isinf(x) or math.isnan(x):
        raise ValueError("MIL literals must be finite")
    return repr(float(x))


def literal(value: object, dtype: str) -> str:
    """MIL literal text: fp16(0.5), int32(1), bool(true), string("x"), tensor<...>([...])."""
    if dtype == "string":
        return f'string("{value}")'
    arr = np.asarray(value)
    if arr.ndim == 0:
        return f"{dtype}({_num(arr.item(), dtype)})"
    flat = ", ".join(_num(v, dtype) for v in arr.reshape(-1).tolist())
    return f"{type_str(arr.shape, dtype)}([{flat}])"


class Mil:
    """Builds one `main` function; names are generated unless given."""

    def __init__(self) -> None:
        self.params: list[str] = []
        self.lines: list[str] = []
        self.types: dict[str, tuple[tuple[int, ...] | None, str]] = {}
        self._n = 0

    def _name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def input(self, name: str, shape: tuple[int, ...], dtype: str = "fp16") -> str:
        self.params.append(f"{type_str(shape, dtype)} {name}")
        self.types[name] = (tuple(shape), dtype)
        return name

    def const(self, value: object, dtype: str, name: str | None = None) -> str:
        name = name or self._name("c")
        arr = None if dtype == "string" else np.asarray(value)
        shape = None if arr is None or arr.ndim == 0 else tuple(arr.shape)
        self.lines.append(
            f'{type_str(shape, dtype)} {name} = const()[name = string("{name}"), '
            f"val = {literal(value, dtype)}];"
        )
        self.types[name] = (shape, dtype)
        return name

    def blob(self, shape: tuple[int, ...], path: str, offset: int, dtype: str = "fp16",
             name: str | None = None) -> str:
        name = name or self._name("w")
        t = type_str(shape, dtype)
        self.lines.append(
            f'{t} {name} = const()[name = string("{name}"), val = {t}(BLOBFILE('
            f'path = string("{path}"), offset = uint64({int(offset)})))];'
        )
        self.types[name] = (tuple(shape), dtype)
        return name

    def op(self, op: str, result_shape: tuple[int, ...] | None, result_dtype: str = "fp16",
           result_name: str | None = None, **args: str) -> str:
        """One op; every argument is the name of a value (use const() for literals)."""
        name = result_name or self._name(op)
        self._emit(op, [(name, result_shape, result_dtype)], args)
        return name

    def multi(self, op: str, results: list[tuple[tuple[int, ...], str]], **args: str) -> list[str]:
        names = [self._name(op) for _ in results]
        self._emit(op, [(n, s, d) for n, (s, d) in zip(names, results, strict=True)], args)
        return names

    def _emit(self, op: str, results: list[tuple[str, tuple[int, ...] | None, str]],
              args: dict[str, str]) -> None:
        argtext = ", ".join(f"{k} = {v}" for k, v in args.items())
        if len(results) == 1:
            n, s, d = results[0]
            lhs = f"{type_str(s, d)} {n}"
        else:
            lhs = "(" + ", ".join(f"{type_str(s, d)} {n}" for n, s, d in results) + ")"
        self.lines.append(f'{lhs} = {op}({argtext})[name = string("{results[0][0]}")];')
        for n, s, d in results:
            self.types[n] = (s, d)

    def conv(self, x: str, weight: str, result_shape: tuple[int, ...],
             result_name: str | None = None) -> str:
        """A 1x1 conv written as the device wants it (all five params as consts)."""
        return self.op("conv", result_shape, "fp16", result_name, x=x, weight=weight,
                       strides=self.const([1, 1], "int32"),
                       pad_type=self.const("valid", "string"),
                       pad=self.const([0, 0, 0, 0], "int32"),
                       dilations=self.const([1, 1], "int32"),
                       groups=self.const(1, "int32"))

    # ---- device-shaped I/O around arbitrary tensors -------------------------

    def wrap_input(self, name: str, shape: tuple[int, ...]) -> str:
        """An fp16 input [1, C, 1, 32] whose first prod(shape) elements become `shape`."""
        n = int(np.prod(shape))
        total = io_elems(n)
        self.input(name, (1, total // IO_SEQ, 1, IO_SEQ))
        # flat along channels: the device bounds W at 16384 but C at 65536 (ANE-C09)
        flat = self.op("reshape", (1, total, 1, 1), x=name,
                       shape=self.const([1, total, 1, 1], "int32"))
        if n != total:
            flat = self.op("slice_by_size", (1, n, 1, 1), x=flat,
                           begin=self.const([0, 0, 0, 0], "int32"),
                           size=self.const([1, n, 1, 1], "int32"))
        return self.op("reshape", tuple(shape), x=flat,
                       shape=self.const(list(shape), "int32"))

    def wrap_output(self, value: str, name: str) -> str:
        """An output [1, C, 1, 32] holding the fp16 `value` flattened, zero padded."""
        shape, dtype = self.types[value]
        n = int(np.prod(shape)) if shape else 1
        total = io_elems(n)
        flat = self.op("reshape", (1, n, 1, 1), dtype,
                       x=value, shape=self.const([1, n, 1, 1], "int32"))
        if n != total:
            flat = self.op("pad", (1, total, 1, 1), dtype, x=flat,
                           pad=self.const([0, total - n, 0, 0, 0, 0], "int32"),
                           mode=self.const("constant", "string"),
                           constant_val=self.const(0.0, "fp16"))
        return self.op("reshape", (1, total // IO_SEQ, 1, IO_SEQ), dtype, name, x=flat,
                       shape=self.const([1, total // IO_SEQ, 1, IO_SEQ], "int32"))

    def text(self, outputs: list[str]) -> str:
        body = "\n".join("        " + line for line in self.lines)
        return (
            HEADER
            + "{\n"
            + f"    func main<ios18>({', '.join(self.params)}) {{\n"
            + body
            + f"\n    }} -> ({', '.join(outputs)});\n"
            + "}\n"
        )


def io_elems(n: int) -> int:
    """Elements of a device-shaped I/O tensor that holds n values."""
    n = max(n, MIN_IO_ELEMS)
    return -(-n // IO_SEQ) * IO_SEQ


def to_io(arr: np.ndarray) -> np.ndarray:
    """`arr` flattened, fp16, zero padded to a device-shaped input."""
    flat = np.asarray(arr, dtype=np.float16).reshape(-1)
    total = io_elems(flat.size)
    out = np.zeros(total, np.float16)
    out[: flat.size] = flat
    return out.reshape(1, total // IO_SEQ, 1, IO_SEQ)


def from_io(out: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    return np.asarray(out).reshape(-1)[:n].reshape(shape)
