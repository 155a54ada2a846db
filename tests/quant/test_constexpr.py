"""The constexpr ops on vane: the weights vane computes from compressed consts equal
coremltools' reference `decompress` of each op bit for bit (read back through a conv
with one-hot inputs, on the prefill GEMM path and the decode GEMV path), the formats'
mappings hold the reference dequantizers' values where they are exact, programs that
break the ops' rules are refused by catalog id, and a compressed weight stays
compressed in memory."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import ConstraintError
from orion.ir import Graph
from orion.ir.compile import compile_graph
from orion.ir.quant import QuantTensor, pack_codes
from orion.runtime import weight_memory_bytes

ct = pytest.importorskip("coremltools")
pytestmark = pytest.mark.native


def _ios18():
    from coremltools.converters.mil.mil.ops.defs.iOS18 import compression

    return compression


def _read_back(q: QuantTensor, column: bool) -> np.ndarray:
    """W as vane computes it: conv(x, W) with one-hot x, the product of one weight and
    1 summed with zeros, which is the weight exactly. `column`: one input column at a
    time (the decode GEMV), else all at once (the prefill GEMM)."""
    rows, cols = q.shape[:2]
    g = Graph("readback")
    w = g.const(q.with_shape((rows, cols, 1, 1)), name="w")
    if column:
        x = g.input("x", (1, cols // 32, 1, 32))
        y = g.conv1x1(g.reshape(x, (1, cols, 1, 1)), w)
        g.output("y", g.reshape(g.pad(y, ((0, 0), (0, -rows % 32), (0, 0), (0, 0))),
                                (1, -(-rows // 32), 1, 32)))
        cg = compile_graph(g)
        try:
            out = np.empty((rows, cols), np.float32)
            for j in range(cols):
                e = np.zeros(cols, np.float16)
                e[j] = 1
                out[:, j] = cg.run({"x": e.reshape(1, cols // 32, 1, 32)})["y"].reshape(-1)[:rows]
            return out
        finally:
            cg.release()
    x = g.input("x", (1, cols, 1, cols))
    g.output("y", g.conv1x1(x, w))
    cg = compile_graph(g)
    try:
        return cg.run({"x": np.eye(cols, dtype=np.float16).reshape(1, cols, 1, cols)})[
            "y"].reshape(rows, cols)
    finally:
        cg.release()


def _random_shift_scale(rng, code_dtype, shape, grid, offset):
    bits = 4 if "4" in code_dtype else 8
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if code_dtype.startswith("int") else \
        (0, 1 << bits)
    codes = rng.integers(lo, hi, shape)
    scale = (rng.standard_normal(grid) * 0.01).astype(np.float16)
    off = None
    if offset == "fp16":
        off = (rng.standard_normal(grid) * 5).astype(np.float16)
    q = QuantTensor("shift_scale", shape, pack_codes(codes, bits), code_dtype, scale, off)
    return q, codes


CASES = [("uint4", (64, 128), (64, 2), "fp16"), ("int4", (96, 64), (96, 2), None),
         ("int8", (32, 256), (32, 8), None), ("uint8", (48, 64), (48, 1), "fp16"),
         ("uint4", (64, 96), (4, 96), "fp16"), ("int4", (32, 64), (1, 1), None)]


@pytest.mark.parametrize("code_dtype,shape,grid,offset", CASES)
@pytest.mark.parametrize("column", [False, True])
def test_shift_scale_is_coremltools_decompress(code_dtype, shape, grid, offset, column):
    rng = np.random.default_rng(hash((code_dtype, shape, offset)) % 1000)
    q, codes = _random_shift_scale(rng, code_dtype, shape, grid, offset)
    np_dtype = np.int8 if code_dtype.startswith("int") else np.uint8
    ref = _ios18().constexpr_blockwise_shift_scale.decompress(
        codes.astype(np_dtype), q.scale, q.offset)
    assert ref.dtype == np.float16
    np.testing.assert_array_equal(q.dense(), ref)
    np.testing.assert_array_equal(_read_back(q, column), ref.astype(np.float32))


@pytest.mark.parametrize("bits,shape,grid", [(4, (64, 64), (64, 2)), (2, (32, 128), (4, 1)),
                                             (3, (40, 96), (40, 3)), (6, (32, 64), (1, 1)),
                                             (1, (32, 64), (32, 1)), (8, (32, 32), (32, 1))])
def test_lut_is_coremltools_decompress(bits, shape, grid):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, shape)
    lut = (rng.standard_normal((*grid, 1 << bits, 1)) * 0.1).astype(np.float16)
    q = QuantTensor("lut", shape, pack_codes(codes, bits), f"uint{bits}", lut=lut)
    ref = _ios18().constexpr_lut_to_dense.decompress(codes.astype(np.uint8), lut, None)
    np.testing.assert_array_equal(q.dense(), ref)
    np.testing.assert_array_equal(_read_back(q, column=bits == 4), ref.astype(np.float32))


@pytest.mark.parametrize("code_dtype", ["int8", "uint8"])
def test_affine_dequantize_is_coremltools_decompress(code_dtype):
    from coremltools.converters.mil.mil.ops.defs.iOS16.constexpr_ops import (
        constexpr_affine_dequantize,
    )

    rng = np.random.default_rng(7)
    np_dtype = np.dtype(code_dtype)
    info = np.iinfo(np_dtype)
    codes = rng.integers(info.min, info.max + 1, (64, 96)).astype(np_dtype)
    zero = rng.integers(info.min, info.max + 1, 64).astype(np_dtype)
    scale = (rng.random(64) * 0.01 + 1e-3).astype(np.float16)
    q = QuantTensor("affine", (64, 96), pack_codes(codes, 8), code_dtype, scale, zero, axis=0)
    ref = constexpr_affine_dequantize.decompress(codes, zero, scale, 0)
    np.testing.assert_array_equal(q.dense(), ref)
    np.testing.assert_array_equal(_read_back(q, column=True), ref.astype(np.float32))


def test_transposed_and_row_slices_keep_every_value():
    rng = np.random.default_rng(3)
    q, _ = _random_shift_scale(rng, "uint4", (64, 96), (64, 3), "fp16")
    np.testing.assert_array_equal(q.transposed().dense(), q.dense().T)
    part = q.rows(16, 40, pad_to=32)
    np.testing.assert_array_equal(part.dense()[:24], q.dense()[16:40])
    assert not part.dense()[24:].any()
    lut = QuantTensor("lut", (32, 64), pack_codes(rng.integers(0, 4, (32, 64)), 2), "uint2",
                      lut=rng.standard_normal((32, 1, 4, 1)).astype(np.float16))
    np.testing.assert_array_equal(lut.transposed().dense(), lut.dense().T)


def test_a_compressed_weight_stays_compressed_in_memory():
    rows, cols = 2048, 1024
    rng = np.random.default_rng(0)
    q, _ = _random_shift_scale(rng, "uint4", (rows, cols), (rows, cols // 64), "fp16")
    g = Graph("resident")
    x = g.input("x", (1, cols, 1, 32))
    g.output("y", g.conv1x1(x, g.const(q.with_shape((rows, cols, 1, 1)), name="w")))
    before = weight_memory_bytes()
    cg = compile_graph(g)
    try:
        held = weight_memory_bytes() - before
        assert q.nbytes <= held < q.nbytes + 64 * 1024, (held, q.nbytes, rows * cols * 2)
    finally:
        cg.release()


# ---- refusals, by catalog id ---------------------------------------------------------


def _program(body: str, blobs: list[tuple[str, object]]) -> tuple[str, dict]:
    from orion.ir.mil import HEADER
    from orion.runtime.blob import blob_bytes

    data, offsets = blob_bytes(blobs)
    for name, off in offsets.items():
        body = body.replace(f"@{name}", str(off))
    text = (HEADER + "{\n    func main<ios18>(tensor<fp16, [1, 64, 1, 384]> x) {\n" + body +
            "\n    } -> (y);\n}\n")
    return text, {"@model_path/weights/w.bin": data}


def _conv(weight: str) -> str:
    return (
        'string pt = const()[name = string("pt"), val = string("valid")];\n'
        'tensor<int32, [2]> st = const()[name = string("st"), val = tensor<int32, [2]>([1, 1])];\n'
        'tensor<int32, [4]> pd = const()[name = string("pd"), '
        'val = tensor<int32, [4]>([0, 0, 0, 0])];\n'
        'tensor<int32, [2]> dl = const()[name = string("dl"), val = tensor<int32, [2]>([1, 1])];\n'
        'int32 gr = const()[name = string("gr"), val = int32(1)];\n'
        'tensor<fp16, [1, 64, 1, 384]> y = conv(dilations = dl, groups = gr, pad = pd, '
        f'pad_type = pt, strides = st, weight = {weight}, x = x)[name = string("y")];')


def _blobfile(ty: str, entry: str) -> str:
    return f'{ty}(BLOBFILE(path = string("@model_path/weights/w.bin"), offset = uint64(@{entry})))'


def _shift_scale_program(data_ty="uint4", scale_ty="fp16", scale_shape=(64, 2, 1, 1),
                         offset: str | None = None, inline_scale=False, pad_bits=None):
    from orion.runtime.blob import PackedCodes

    codes = np.zeros(64 * 64 // (2 if "4" in data_ty else 1), np.uint8)
    data = PackedCodes(data_ty, codes, 64 * 64) if "4" in data_ty else codes.view(
        np.int8 if data_ty == "int8" else np.uint8).reshape(64, 64, 1, 1)
    if pad_bits is not None:   # the entry says one code less: 4 padding bits
        data = PackedCodes(data_ty, codes, 64 * 64 - 1)
    np_scale = np.full(scale_shape, 0.01, np.float16 if scale_ty == "fp16" else np.float32)
    blobs = [("d", data), ("s", np_scale)]
    st = f"tensor<{scale_ty}, [{', '.join(map(str, scale_shape))}]>"
    lines = [f'tensor<{data_ty}, [64, 64, 1, 1]> d = const()[name = string("d"), val = '
             f'{_blobfile(f"tensor<{data_ty}, [64, 64, 1, 1]>", "d")}];',
             f'{st} s = const()[name = string("s"), val = {_blobfile(st, "s")}];']
    args = "data = d, scale = s"
    if offset:
        blobs.append(("o", np.zeros(scale_shape, np.float16 if offset == "fp16" else np.int8)))
        ot = f"tensor<{offset}, [{', '.join(map(str, scale_shape))}]>"
        lines.append(f'{ot} o = const()[name = string("o"), val = {_blobfile(ot, "o")}];')
        args = "data = d, offset = o, scale = s"
    if inline_scale:
        args = f"data = d, scale = {_blobfile(st, 's')}"
    lines.append(f'tensor<fp16, [64, 64, 1, 1]> w = constexpr_blockwise_shift_scale({args})'
                 '[name = string("w")];')
    lines.append(_conv("w"))
    return _program("\n".join(lines), blobs)


@pytest.mark.parametrize("kwargs,cid", [
    ({}, None),
    ({"data_ty": "int8"}, None),
    ({"offset": "fp16"}, None),
    ({"scale_ty": "fp32"}, "ANE-C51"),
    ({"scale_shape": (64, 3, 1, 1)}, "ANE-C51"),
    ({"scale_shape": (64, 2, 1)}, "ANE-C51"),
    ({"offset": "int8"}, "ANE-C51"),
    ({"data_ty": "uint2"}, "ANE-C51"),
    ({"inline_scale": True}, "ANE-C50"),
    ({"pad_bits": 1}, "ANE-C54"),
])
def test_shift_scale_rules(kwargs, cid):
    from orion.runtime import Program

    mil, weights = _shift_scale_program(**kwargs)
    if cid is None:
        Program.compile(mil, weights).release()
        return
    with pytest.raises(ConstraintError) as info:
        Program.compile(mil, weights)
    assert cid in str(info.value), str(info.value)


@pytest.mark.parametrize("lut_shape,idx,cid", [
    ((64, 1, 1, 1, 16, 1), "uint4", None),
    ((64, 1, 1, 1, 8, 1), "uint4", "ANE-C52"),      # 8 entries for 4-bit indices
    ((64, 1, 1, 16, 1), "uint4", "ANE-C52"),         # rank
    ((64, 1, 1, 1, 16, 1), "int4", "ANE-C52"),       # signed indices
    ((48, 1, 1, 1, 16, 1), "uint4", "ANE-C52"),      # 48 does not divide 64
])
def test_lut_rules(lut_shape, idx, cid):
    from orion.runtime import Program
    from orion.runtime.blob import PackedCodes

    lt = f"tensor<fp16, [{', '.join(map(str, lut_shape))}]>"
    it = f"tensor<{idx}, [64, 64, 1, 1]>"
    body = "\n".join([
        f'{it} i = const()[name = string("i"), val = {_blobfile(it, "i")}];',
        f'{lt} l = const()[name = string("l"), val = {_blobfile(lt, "l")}];',
        'tensor<fp16, [64, 64, 1, 1]> w = constexpr_lut_to_dense(indices = i, lut = l)'
        '[name = string("w")];', _conv("w")])
    mil, weights = _program(body, [("i", PackedCodes(idx, np.zeros(2048, np.uint8), 4096)),
                                   ("l", np.zeros(lut_shape, np.float16))])
    if cid is None:
        Program.compile(mil, weights).release()
        return
    with pytest.raises(ConstraintError, match=cid):
        Program.compile(mil, weights)


@pytest.mark.parametrize("zero_ty,scale_ty,cid", [("int8", "fp16", None),
                                                  ("uint8", "fp16", "ANE-C53"),
                                                  ("int8", "fp32", "ANE-C53")])
def test_affine_rules(zero_ty, scale_ty, cid):
    from orion.runtime import Program

    qt, st, zt = ("tensor<int8, [64, 64, 1, 1]>", f"tensor<{scale_ty}, [64]>",
                  f"tensor<{zero_ty}, [64]>")
    body = ("tensor<fp16, [64, 64, 1, 1]> w = constexpr_affine_dequantize()[axis = int32(0), "
            f'name = string("w"), quantized_data = {_blobfile(qt, "q")}, scale = '
            f'{_blobfile(st, "s")}, zero_point = {_blobfile(zt, "z")}];\n' + _conv("w"))
    mil, weights = _program(body, [
        ("q", np.zeros((64, 64, 1, 1), np.int8)),
        ("s", np.full(64, 0.01, np.float16 if scale_ty == "fp16" else np.float32)),
        ("z", np.zeros(64, np.dtype(zero_ty)))])
    if cid is None:
        Program.compile(mil, weights).release()
        return
    with pytest.raises(ConstraintError, match=cid):
        Program.compile(mil, weights)
