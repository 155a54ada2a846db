"""The MIL emitter: a legal program -> MIL text plus one weight blob.

Two stages. `lower` turns each IR node into MIL statements (ane-facts §2.4 spellings;
conv for conv1x1 with no bias, ANE-C05; split as one slice_by_size per part), writing
op parameters (transpose flags, axes, shapes) as literals. The pass
`name_literal_arguments` then declares every literal as a named const in front of its
user (ANE-C04: the device rejects inline arguments). Printing is deterministic: the
same program gives the same text and the same blob bytes, which the program cache
relies on (the runtime's identifier is derived from the text and the weight keys).

Weights: every tensor const (rank >= 1) goes into the program's one blob file
(`@model_path/weights/<program>.bin`, so keys are unique per program and two programs
never share an identifier), each entry at a 64-byte-aligned offset; BLOBFILE offsets are
each tensor's metadata header offset (ANE-C28), as `orion.runtime.blob.blob_bytes` returns them.
One file per program on every path (inference, training, LoRA): macOS 27 verifies a
program's bundle with one hash over its weight files, which several files fail
(docs/ane-backend.md), and a delta update patches offsets within that file. Scalar consts
are inline fp16 literals.

With `share_weights` (inference programs, whose weights are never patched), tensors with
equal bytes are stored once in the file. Programs that bake one tensor (a layer's prefill
buckets and its decode program) hold it in their own files; vane holds equal tensors once
in memory whichever files they came from (csrc/core/weight_cache.h).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orion.errors import InvalidArgumentError
from orion.ir.graph import Graph, Value
from orion.ir.ops import Op
from orion.ir.program import IOSpec, ProgramIR
from orion.ir.quant import QuantTensor
from orion.ir.types import DType, TensorType
from orion.runtime.blob import PackedCodes

HEADER = (
    "program(1.3)\n"
    '[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, '
    '{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, '
    '{"coremltools-version", "9.0"}})]\n'
)
FP16_MAX = 65504.0
_PLACEHOLDER = re.compile(r"\{(key|off):([A-Za-z0-9_]+)\}")


@dataclass(frozen=True)
class Literal:
    """An inline MIL value: its MIL type and its constructor text, e.g.
    ("bool", "bool(false)") or ("tensor<int32, [4]>", "tensor<int32, [4]>([0, 1, 3, 2])")."""

    type: str
    text: str


@dataclass
class Stmt:
    """`<type> <result> = <op>(<args>)[name = string("<result>")<, val = ...>];`"""

    type: str
    result: str
    op: str
    args: list[tuple[str, str | Literal]] = field(default_factory=list)
    val: str | None = None   # const only
    attrs: list[tuple[str, str]] = field(default_factory=list)   # more [attributes]


@dataclass
class EmittedProgram:
    name: str
    mil: str
    weights: dict[str, bytearray | Path]            # key -> blob file bytes, or the file
    weight_offsets: dict[str, tuple[str, int]]      # IR const name -> (key, metadata offset)
    inputs: list[IOSpec]                            # binding order
    outputs: list[IOSpec]


# ---- literals and types -------------------------------------------------------------


def mil_type(t: TensorType) -> str:
    if t.rank == 0:
        return t.dtype.value
    return f"tensor<{t.dtype.value}, [{', '.join(str(d) for d in t.shape)}]>"


def fp16_text(x: float) -> str:
    """Shortest decimal that reads back as the same fp16 value."""
    with np.errstate(over="ignore"):
        h = np.float16(x)
    if not np.isfinite(h):
        raise InvalidArgumentError(f"{x} is outside the fp16 range (ANE-C41)")
    return repr(float(h))


def lit_bool(b: bool) -> Literal:
    return Literal("bool", f"bool({'true' if b else 'false'})")


def lit_int(i: int) -> Literal:
    return Literal("int32", f"int32({int(i)})")


def lit_ints(values: tuple[int, ...] | list[int]) -> Literal:
    t = f"tensor<int32, [{len(values)}]>"
    return Literal(t, f"{t}([{', '.join(str(int(v)) for v in values)}])")


def lit_str(s: str) -> Literal:
    return Literal("string", f'string("{s}")')


def lit_fp16(x: float) -> Literal:
    return Literal("fp16", f"fp16({fp16_text(x)})")


# ---- stage 1: lowering ----------------------------------------------------------------


class _Names:
    """MIL variable names: I/O keep their device names, every other value is v_<name>."""

    def __init__(self, g: Graph) -> None:
        self.of: dict[Value, str] = {v: v.name for v in g.inputs}
        for k, v in g.outputs.items():
            self.of[v] = k

    def __call__(self, v: Value) -> str:
        return self.of.setdefault(v, f"v_{v.name}")


def lower(p: ProgramIR) -> tuple[list[Stmt], list[tuple[str, np.ndarray | PackedCodes]],
                               dict[str, str]]:
    """MIL statements with literal arguments, the blob entries (name, fp16 array) in
    program order, and for each blob entry the IR const it came from."""
    g = p.graph
    name = _Names(g)
    stmts: list[Stmt] = []
    blobs: list[tuple[str, np.ndarray | PackedCodes]] = []
    const_of: dict[str, str] = {}
    for node in g.nodes:
        op, a = node.op, node.attrs
        if op is Op.INPUT:
            continue
        outs = node.outputs
        x = [name(v) for v in node.inputs]
        ty = mil_type(outs[0].type)
        res = name(outs[0])
        if op is Op.CONST and isinstance(a["value"], QuantTensor):
            q_stmts, q_blobs = _lower_quant(res, a["value"], ty)
            stmts += q_stmts
            blobs += q_blobs
            continue
        if op is Op.CONST:
            value: np.ndarray = a["value"]
            fp32 = outs[0].dtype is DType.FP32
            if value.ndim == 0:
                lit = f"fp32({float(value)!r})" if fp32 else lit_fp16(float(value)).text
                stmts.append(Stmt(ty, res, "const", val=lit))
                continue
            with np.errstate(over="ignore"):
                arr = value.astype(np.float32 if fp32 else np.float16, copy=False)
            if not np.all(np.isfinite(arr)):
                raise InvalidArgumentError(f"const {node.name}: values outside the fp16 range "
                                           f"(ANE-C41)")
            blobs.append((res, arr))
            const_of[res] = node.name
            stmts.append(Stmt(ty, res, "const", val=_blobfile(ty, res)))
            continue
        stmts.extend(_lower_op(node.op, a, x, ty, res, outs, name))
    return stmts, blobs, const_of


def _blobfile(ty: str, entry: str) -> str:
    """A BLOBFILE value; emit() fills in the key and the entry's offset."""
    return (f"{ty}(BLOBFILE(path = string(\"{{key:{entry}}}\"), "
            f"offset = uint64({{off:{entry}}})))")


def _quant_part(name: str, arr: np.ndarray | PackedCodes, mtype: str, shape: tuple[int, ...],
                ) -> tuple[Stmt, tuple[str, np.ndarray | PackedCodes]]:
    ty = f"tensor<{mtype}, [{', '.join(str(d) for d in shape)}]>"
    return Stmt(ty, name, "const", val=_blobfile(ty, name)), (name, arr)


def _codes_entry(q: QuantTensor) -> np.ndarray | PackedCodes:
    if q.bits == 8:
        return q.codes.view(np.int8 if q.code_dtype == "int8" else np.uint8).reshape(q.shape)
    return PackedCodes(q.code_dtype, q.codes, q.size)


def _lower_quant(res: str, q: QuantTensor, ty: str
                 ) -> tuple[list[Stmt], list[tuple[str, np.ndarray | PackedCodes]]]:
    """A compressed weight: its parts as named consts over blob entries, then the
    constexpr op that expands them (ANE-C50: every input a named const)."""
    out: list[Stmt] = []
    blobs: list[tuple[str, np.ndarray | PackedCodes]] = []

    def part(suffix: str, arr: np.ndarray | PackedCodes, mtype: str,
             shape: tuple[int, ...]) -> str:
        stmt, entry = _quant_part(f"{res}_{suffix}", arr, mtype, shape)
        out.append(stmt)
        blobs.append(entry)
        return stmt.result

    if q.op == "affine":
        zp = np.asarray(q.offset)
        ts = (f"tensor<fp16, [{q.scale.size}]>" if q.scale.ndim else "fp16")  # type: ignore
        tz = f"tensor<{q.code_dtype}, [{zp.size}]>" if zp.ndim else q.code_dtype
        qshape = f"tensor<{q.code_dtype}, [{', '.join(str(d) for d in q.shape)}]>"
        blobs.append((f"{res}_qdata", _codes_entry(q)))
        attrs = [("axis", f"int32({q.axis})"),
                 ("quantized_data", _blobfile(qshape, f"{res}_qdata"))]
        if q.scale.ndim:   # type: ignore[union-attr]
            blobs.append((f"{res}_qscale", q.scale))  # type: ignore[arg-type]
            attrs.append(("scale", _blobfile(ts, f"{res}_qscale")))
        else:
            attrs.append(("scale", lit_fp16(float(q.scale)).text))  # type: ignore[arg-type]
        if zp.ndim:
            blobs.append((f"{res}_qzero", zp.astype(np.int8 if q.code_dtype == "int8"
                                                    else np.uint8)))
            attrs.append(("zero_point", _blobfile(tz, f"{res}_qzero")))
        else:
            attrs.append(("zero_point", f"{q.code_dtype}({int(zp)})"))
        out.append(Stmt(ty, res, "constexpr_affine_dequantize", attrs=attrs))
        return out, blobs
    if q.op == "lut":
        idx = part("indices", _codes_entry(q), q.code_dtype, q.shape)
        lut = part("lut", q.lut, "fp16", q.lut.shape)  # type: ignore[arg-type, union-attr]
        out.append(Stmt(ty, res, "constexpr_lut_to_dense", [("indices", idx), ("lut", lut)]))
        return out, blobs
    args = [("data", part("data", _codes_entry(q), q.code_dtype, q.shape))]
    if q.offset is not None:
        args.append(("offset", part("offset", q.offset, "fp16", q.offset.shape)))
    args.append(("scale", part("scale", q.scale, "fp16", q.scale.shape)))  # type: ignore
    out.append(Stmt(ty, res, "constexpr_blockwise_shift_scale", args))
    return out, blobs


def _lower_op(op: Op, a: dict, x: list[str], ty: str, res: str, outs: list[Value],
              name: _Names) -> list[Stmt]:
    simple = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.POW: "pow"}
    unary = {Op.RELU: "relu", Op.TANH: "tanh", Op.SIGMOID: "sigmoid", Op.EXP: "exp",
             Op.NEG: "neg", Op.SQRT: "sqrt", Op.IDENTITY: "identity"}
    if op in simple:
        return [Stmt(ty, res, simple[op], [("x", x[0]), ("y", x[1])])]
    if op in unary:
        return [Stmt(ty, res, unary[op], [("x", x[0])])]
    match op:
        case Op.CONV1X1:
            return [Stmt(ty, res, "conv", [
                ("dilations", lit_ints([1, 1])), ("groups", lit_int(1)),
                ("pad", lit_ints([0, 0, 0, 0])), ("pad_type", lit_str("valid")),
                ("strides", lit_ints([1, 1])), ("weight", x[1]), ("x", x[0])])]
        case Op.MATMUL:
            return [Stmt(ty, res, "matmul", [
                ("transpose_x", lit_bool(a["transpose_x"])),
                ("transpose_y", lit_bool(a["transpose_y"])), ("x", x[0]), ("y", x[1])])]
        case Op.RESHAPE:
            return [Stmt(ty, res, "reshape", [("shape", lit_ints(a["shape"])), ("x", x[0])])]
        case Op.TRANSPOSE:
            return [Stmt(ty, res, "transpose", [("perm", lit_ints(a["perm"])), ("x", x[0])])]
        case Op.CAST:
            return [Stmt(ty, res, "cast", [("dtype", lit_str(DType(a["dtype"]).value)),
                                           ("x", x[0])])]
        case Op.SOFTMAX:
            return [Stmt(ty, res, "softmax", [("axis", lit_int(a["axis"])), ("x", x[0])])]
        case Op.REDUCE_SUM | Op.REDUCE_MEAN | Op.REDUCE_MAX:
            return [Stmt(ty, res, op.value, [("axes", lit_ints(a["axes"])),
                                             ("keep_dims", lit_bool(a["keep_dims"])),
                                             ("x", x[0])])]
        case Op.SLICE:
            return [Stmt(ty, res, "slice_by_size", [("begin", lit_ints(a["begin"])),
                                                    ("size", lit_ints(a["size"])),
                                                    ("x", x[0])])]
        case Op.SPLIT:
            out, start = [], 0
            for v in outs:
                begin = [0] * v.type.rank
                begin[a["axis"]] = start
                start += v.shape[a["axis"]]
                out.append(Stmt(mil_type(v.type), name(v), "slice_by_size", [
                    ("begin", lit_ints(begin)), ("size", lit_ints(v.shape)), ("x", x[0])]))
            return out
        case Op.PAD:
            flat = [n for pair in a["pads"] for n in pair]
            return [Stmt(ty, res, "pad", [("constant_val", lit_fp16(0.0)),
                                          ("mode", lit_str("constant")),
                                          ("pad", lit_ints(flat)), ("x", x[0])])]
        case Op.CLIP:
            return [Stmt(ty, res, "clip", [("alpha", lit_fp16(max(a["lo"], -FP16_MAX))),
                                           ("beta", lit_fp16(min(a["hi"], FP16_MAX))),
                                           ("x", x[0])])]
    raise InvalidArgumentError(f"{op.value} cannot be emitted: legalize the graph first "
                               f"(gelu: ANE-C02, rsqrt: ANE-C03, concat: ANE-C01)")


# ---- stage 2: named arguments (ANE-C04) --------------------------------------------


def check_named_arguments(stmts: list[Stmt]) -> list[str]:
    """ANE-C04 violations: op arguments written inline."""
    return [f"ANE-C04 at {s.result}: argument {k} is an inline literal {v.text}"
            for s in stmts for k, v in s.args if isinstance(v, Literal)]


def name_literal_arguments(stmts: list[Stmt]) -> list[Stmt]:
    """Every literal argument becomes `const()` named <result>_<arg>, declared just
    before the statement that reads it."""
    out: list[Stmt] = []
    for s in stmts:
        args = []
        for k, v in s.args:
            if isinstance(v, Literal):
                cname = f"{s.result}_{k}"
                out.append(Stmt(v.type, cname, "const", val=v.text))
                v = cname
            args.append((k, v))
        out.append(Stmt(s.type, s.result, s.op, args, s.val, s.attrs))
    return out


# ---- printing -------------------------------------------------------------------------


def format_stmt(s: Stmt) -> str:
    if s.op == "const":
        return f'{s.type} {s.result} = const()[name = string("{s.result}"), val = {s.val}];'
    args = ", ".join(f"{k} = {v}" for k, v in s.args)
    attrs = sorted([("name", f'string("{s.result}")'), *s.attrs])
    return f'{s.type} {s.result} = {s.op}({args})[{", ".join(f"{k} = {v}" for k, v in attrs)}];'


def weight_key(program_name: str) -> str:
    return f"@model_path/weights/{program_name}.bin"


def _content(arr: np.ndarray | PackedCodes) -> bytes:
    if isinstance(arr, PackedCodes):
        digest = hashlib.sha256(f"{arr.dtype}|{arr.count}".encode())
        digest.update(np.ascontiguousarray(arr.data).data)
        return digest.digest()
    digest = hashlib.sha256(arr.dtype.str.encode())   # the blob entry holds the dtype too
    digest.update(np.ascontiguousarray(arr).data)
    return digest.digest()


def _weight_file(name: str, blobs: list[tuple[str, np.ndarray]], dedupe: bool,
                 folder: Path | None = None,
                 ) -> tuple[dict[str, bytearray | Path], dict[str, tuple[str, int]]]:
    """The program's one weight file (key -> bytes, or the file written in `folder`:
    the tensors go straight from their arrays to disk, with no second copy of them in
    memory) and each blob entry's (key, metadata offset). With `dedupe`, an entry whose
    bytes equal an earlier one's points at it."""
    from orion.runtime.blob import blob_bytes, write_blob

    if not blobs:
        return {}, {}
    key = weight_key(name)
    entries: list[tuple[str, np.ndarray]] = []
    alias: dict[str, str] = {}   # entry -> the earlier entry holding the same bytes
    first: dict[bytes, str] = {}
    for res, arr in blobs:
        if dedupe:
            digest = _content(arr)
            if digest in first:
                alias[res] = first[digest]
                continue
            first[digest] = res
        entries.append((res, arr))
    data: bytearray | Path
    if folder is not None:
        data = folder / f"{name}.bin"
        offsets = write_blob(data, entries)
    else:
        data, offsets = blob_bytes(entries)
    where = {res: (key, off) for res, off in offsets.items()}
    where.update({res: where[earlier] for res, earlier in alias.items()})
    return {key: data}, where


def emit(p: ProgramIR, *, share_weights: bool = False,
         weights_folder: Path | None = None) -> EmittedProgram:
    """MIL text and weight blobs of a legalized program (see `orion.ir.legalize`); with
    `weights_folder` the blob is a file written there (`_weight_file`)."""
    stmts, blobs, const_of = lower(p)
    stmts = name_literal_arguments(stmts)
    weights, where = _weight_file(p.name, blobs, share_weights, weights_folder)
    lines = []
    for s in stmts:
        line = format_stmt(s)
        if "{key:" in line:   # every BLOBFILE the statement holds
            line = _PLACEHOLDER.sub(lambda m: where[m.group(2)][0] if m.group(1) == "key"
                                    else str(where[m.group(2)][1]), line)
        lines.append("        " + line)
    g = p.graph
    params = ", ".join(f"{mil_type(v.type)} {v.name}" for v in g.inputs)
    text = (HEADER + "{\n" + f"    func main<ios18>({params}) {{\n" + "\n".join(lines)
            + f"\n    }} -> ({', '.join(g.outputs)});\n" + "}\n")
    return EmittedProgram(p.name, text, weights,
                          {const_of[n]: ko for n, ko in where.items() if n in const_of},
                          list(p.inputs), list(p.outputs))
