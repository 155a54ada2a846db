"""One small MIL program per statically checked row of the constraint catalog: each is
refused at compile with its id in the message (and the fix), and a program that keeps
every rule compiles. The programs differ from the valid one in the one thing the row
is about, so the refusal cannot come from anything else."""

import numpy as np
import pytest

from orion.errors import ConstraintError, InvalidArgumentError
from orion.runtime import Program
from orion.runtime.blob import blob_bytes

pytestmark = pytest.mark.native

IO = "tensor<fp16, [1, 768, 1, 32]>"
WKEY = "@model_path/weights/w.bin"


def program(body: str, inputs: str = f"{IO} in_x", outputs: str = "out_y") -> str:
    return (
        "program(1.3)\n"
        '[buildInfo = dict<string, string>({{"coremlc-version", "3505.4.1"}})]\n'
        "{\n"
        f"    func main<ios18>({inputs}) {{\n"
        + "".join(f"        {line.strip()}\n" for line in body.strip().splitlines())
        + f"    }} -> ({outputs});\n"
        "}\n"
    )


def const(name: str, mil_type: str, val: str) -> str:
    return f'{mil_type} {name} = const()[name = string("{name}"), val = {val}];\n'


def blob_const(name: str, shape: str, path: str = WKEY, offset: int = 64) -> str:
    t = f"tensor<fp16, [{shape}]>"
    return const(name, t, f'{t}(BLOBFILE(path = string("{path}"), offset = uint64({offset})))')


def op(result: str, mil_type: str, call: str) -> str:
    return f'{mil_type} {result} = {call}[name = string("{result}")];\n'


CONV_PARAMS = (
    const("pt", "string", 'string("valid")')
    + const("st", "tensor<int32, [2]>", "tensor<int32, [2]>([1, 1])")
    + const("pd", "tensor<int32, [4]>", "tensor<int32, [4]>([0, 0, 0, 0])")
    + const("dl", "tensor<int32, [2]>", "tensor<int32, [2]>([1, 1])")
    + const("gr", "int32", "int32(1)")
)
CONV_ARGS = "dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st"
RELU = op("out_y", IO, "relu(x = in_x)")


def conv_weights(out_ch: int = 768, in_ch: int = 768) -> dict[str, bytes]:
    data, offsets = blob_bytes({"w": np.zeros((out_ch, in_ch, 1, 1), np.float16)})
    assert offsets["w"] == 64
    return {WKEY: data}


def refused(cid: str, mil: str, weights: dict[str, bytes] | None = None) -> str:
    with pytest.raises(ConstraintError) as info:
        Program.compile(mil, weights=weights or {}, backend="vane")
    message = str(info.value)
    assert message.startswith(f"{cid} ("), message
    assert info.value.constraint_id == cid
    assert "Fix: " in message
    return message


# ---- the program that keeps every rule -------------------------------------------


VALID = program(
    CONV_PARAMS
    + blob_const("w", "768, 768, 1, 1")
    + op("c", IO, f"conv({CONV_ARGS}, weight = w, x = in_x)")
    + const("b", "tensor<fp16, [1, 768, 1, 1]>",
            "tensor<fp16, [1, 768, 1, 1]>([" + ", ".join(["0.5"] * 768) + "])")
    + op("cb", IO, "add(x = c, y = b)")
    + const("tx", "bool", "bool(false)")
    + const("ty", "bool", "bool(true)")
    + const("sh", "tensor<int32, [4]>", "tensor<int32, [4]>([1, 12, 64, 32])")
    + op("h", "tensor<fp16, [1, 12, 64, 32]>", "reshape(shape = sh, x = cb)")
    + op("s", "tensor<fp16, [1, 12, 64, 64]>",
         "matmul(transpose_x = tx, transpose_y = ty, x = h, y = h)")
    + const("ax", "int32", "int32(-1)")
    + op("p", "tensor<fp16, [1, 12, 64, 64]>", "softmax(axis = ax, x = s)")
    + op("o", "tensor<fp16, [1, 12, 64, 32]>",
         "matmul(transpose_x = tx, transpose_y = tx, x = p, y = h)")
    + const("back", "tensor<int32, [4]>", "tensor<int32, [4]>([1, 768, 1, 32])")
    + op("out_a", IO, "reshape(shape = back, x = o)")
    + const("nh", "fp16", "fp16(-0x1p-1)")
    + op("out_b", IO, "pow(x = in_x, y = nh)")
    + const("lo", "fp16", "fp16(-65504)")
    + const("hi", "fp16", "fp16(65504)")
    + op("out_c", IO, "clip(x = cb, alpha = lo, beta = hi)"),
    outputs="out_a, out_b, out_c",
)


def test_valid_program_compiles_and_runs():
    prog = Program.compile(VALID, weights=conv_weights(), backend="vane")
    try:
        assert [io.name for io in prog.outputs] == ["out_a", "out_b", "out_c"]
        assert [io.name for io in prog.inputs] == ["in_x"]
        x = np.random.default_rng(0).uniform(0.5, 4.0, (1, 768, 1, 32)).astype(np.float16)
        got = prog.run({"in_x": x})
        # the weights are zero, so the conv plus bias is 0.5 everywhere
        np.testing.assert_array_equal(got["out_c"], np.full_like(x, 0.5))
        want = (x.astype(np.float64) ** -0.5).astype(np.float16)
        np.testing.assert_allclose(got["out_b"].astype(np.float64), want, rtol=2e-3)
    finally:
        prog.release()


# ---- MIL / ops -------------------------------------------------------------------


def test_c01_concat():
    body = (const("ax", "int32", "int32(1)") + const("il", "bool", "bool(false)")
            + op("out_y", "tensor<fp16, [1, 1536, 1, 32]>",
                 "concat(axis = ax, interleave = il, values = (in_x, in_x))"))
    msg = refused("ANE-C01", program(body))
    assert "line 7, column 9: 'out_y' uses the op concat" in msg and "multi-output" in msg


def test_c02_gelu():
    body = const("m", "string", 'string("EXACT")') + op("out_y", IO, "gelu(mode = m, x = in_x)")
    assert "tanh" in refused("ANE-C02", program(body))


def test_c03_rsqrt():
    assert "pow(x, -0.5)" in refused("ANE-C03", program(op("out_y", IO, "rsqrt(x = in_x)")))


@pytest.mark.parametrize("flag", ["transpose_x", "transpose_y"])
def test_c04_inline_transpose_flag(flag):
    other = "transpose_y" if flag == "transpose_x" else "transpose_x"
    body = (const("f", "bool", "bool(false)")
            + op("out_y", "tensor<fp16, [1, 768, 1, 1]>",
                 f"matmul({flag} = bool(false), {other} = f, x = in_x, y = in_z)"))
    msg = refused("ANE-C04", program(body, inputs=f"{IO} in_x, {IO} in_z"))
    assert flag in msg


def test_c05_conv_bias():
    body = (CONV_PARAMS + blob_const("w", "768, 768, 1, 1")
            + const("b", "tensor<fp16, [768]>", "tensor<fp16, [768]>([" + "0, " * 767 + "0])")
            + op("out_y", IO, f"conv(bias = b, {CONV_ARGS}, weight = w, x = in_x)"))
    assert "separate add" in refused("ANE-C05", program(body), conv_weights())


@pytest.mark.parametrize("returned, says", [
    ("in_x", "is an input"),
    ("k", "is a const"),
    ("nowhere", "is not defined"),
])
def test_c06_returned_variable_not_produced_by_an_op(returned, says):
    body = blob_const("k", "1, 768, 1, 32") + RELU
    msg = refused("ANE-C06", program(body, outputs=f"out_y, {returned}"))
    assert says in msg and f"'{returned}'" in msg


def test_c07_sdpa_refused():
    body = op("out_y", IO, "scaled_dot_product_attention(query = in_x, key = in_x, "
              "value = in_x, attn_mask = in_x)")
    refused("ANE-C07", program(body))


def test_c08_conv_input_channels():
    wide = "tensor<fp16, [1, 32000, 1, 32]>"
    body = (CONV_PARAMS + blob_const("w", "768, 32000, 1, 1")
            + op("out_y", IO, f"conv({CONV_ARGS}, weight = w, x = in_x)"))
    assert "32000 input channels" in refused("ANE-C08", program(body, inputs=f"{wide} in_x"))


def test_c08_conv_output_channels():
    body = (CONV_PARAMS + blob_const("w", "65600, 768, 1, 1")
            + op("out_y", "tensor<fp16, [1, 65600, 1, 32]>",
                 f"conv({CONV_ARGS}, weight = w, x = in_x)"))
    assert "65600 output channels" in refused("ANE-C08", program(body))


def test_c09_width_of_an_io_tensor():
    wide = "tensor<fp16, [1, 8, 1, 16416]>"
    msg = refused("ANE-C09", program(op("out_y", wide, "relu(x = in_x)"), inputs=f"{wide} in_x"))
    assert "W = 16416" in msg


def test_c09_width_of_an_inner_tensor():
    body = (const("sh", "tensor<int32, [4]>", "tensor<int32, [4]>([1, 1, 1, 24576])")
            + op("flat", "tensor<fp16, [1, 1, 1, 24576]>", "reshape(shape = sh, x = in_x)")
            + RELU)
    assert "'flat'" in refused("ANE-C09", program(body))


def many_files(n: int) -> str:
    return "".join(blob_const(f"w{i}", "1, 768, 1, 1", f"@model_path/weights/w{i}.bin")
                   for i in range(n))


def test_c10_more_than_16_weight_files():
    assert "17 distinct weight files" in refused("ANE-C10", program(many_files(17) + RELU))


def test_c10_many_tensors_in_one_file_are_fine():
    # the budget is on files: 17 tensors of one file pass the budget (and then
    # fail only because no weights are given)
    body = "".join(blob_const(f"w{i}", "1, 768, 1, 1", WKEY, 64 + i * 1600) for i in range(17))
    with pytest.raises(InvalidArgumentError, match="not among the 0 weight files"):
        Program.compile(program(body + RELU), weights={}, backend="vane")


def test_c11_inline_scalar_costs_a_slot():
    body = many_files(16) + op("out_y", IO, "mul(x = in_x, y = fp16(2))")
    assert "inline scalar operand" in refused("ANE-C11", program(body))


def test_c12_fp32_io():
    f32 = "tensor<fp32, [1, 768, 1, 32]>"
    refused("ANE-C12", program(op("out_y", f32, "relu(x = in_x)"), inputs=f"{f32} in_x"))


@pytest.mark.parametrize("name", ["stack", "l2_norm", "gather", "tile", "softplus", "log"])
def test_c13_refused_ops(name):
    msg = refused("ANE-C13", program(op("out_y", IO, f"{name}(x = in_x)")))
    assert f"uses the op {name}" in msg


def test_c15_pad_output_width():
    body = (const("pp", "tensor<int32, [2]>", "tensor<int32, [2]>([0, 9200])")
            + op("wide", "tensor<fp16, [1, 768, 1, 9232]>", "pad(x = in_x, pad = pp)") + RELU)
    assert "last axis of 9232" in refused("ANE-C15", program(body))


# ---- memory / I/O / layout -------------------------------------------------------


def test_c19_output_name_is_a_prefix_of_another():
    body = op("y", IO, "relu(x = in_x)") + op("y2", IO, "sigmoid(x = in_x)")
    msg = refused("ANE-C19", program(body, outputs="y, y2"))
    assert "'y' is a prefix of output 'y2'" in msg and "equal length" in msg


def test_c20_input_name_is_a_prefix_of_another():
    body = op("out_y", IO, "add(x = x, y = x2)")
    msg = refused("ANE-C20", program(body, inputs=f"{IO} x2, {IO} x"))
    assert "'x' is a prefix of input 'x2'" in msg


def test_c22_last_axis_not_a_multiple_of_64_bytes():
    t = "tensor<fp16, [1, 768, 1, 48]>"
    assert "96 bytes" in refused("ANE-C22", program(op("out_y", t, "relu(x = in_x)"),
                                                     inputs=f"{t} in_x"))


def test_c23_io_tensor_below_49152_bytes():
    t = "tensor<fp16, [1, 64, 1, 32]>"
    assert "4096 bytes" in refused("ANE-C23", program(op("out_y", t, "relu(x = in_x)"),
                                                       inputs=f"{t} in_x"))


def test_c23_small_output():
    t = "tensor<fp16, [1, 1, 1, 32]>"
    body = (const("ax", "tensor<int32, [1]>", "tensor<int32, [1]>([1])")
            + const("kd", "bool", "bool(true)")
            + op("out_y", t, "reduce_sum(axes = ax, keep_dims = kd, x = in_x)"))
    assert "output 'out_y'" in refused("ANE-C23", program(body))


def test_c24_width_below_32():
    t = "tensor<fp16, [1, 2048, 1, 16]>"
    refused("ANE-C24", program(op("out_y", t, "relu(x = in_x)"), inputs=f"{t} in_x"))


def test_c28_offset_not_a_multiple_of_64():
    body = blob_const("w", "768, 768, 1, 1", offset=100) + RELU
    refused("ANE-C28", program(body))


def test_c28_offset_at_the_data_not_the_header():
    body = (CONV_PARAMS + blob_const("w", "768, 768, 1, 1", offset=128)
            + op("out_y", IO, f"conv({CONV_ARGS}, weight = w, x = in_x)"))
    msg = refused("ANE-C28", program(body), conv_weights())
    assert "headers are at 64" in msg


@pytest.mark.parametrize("t", [
    "tensor<fp16, [1, 768, 32]>",
    "tensor<fp16, [2, 768, 1, 32]>",
    "tensor<fp16, [1, 768, 2, 32]>",
    "fp16",
])
def test_c29_io_not_rank4_channel_first(t):
    body = op("out_y", IO, "relu(x = in_z)")
    assert "'in_x'" in refused("ANE-C29", program(body, inputs=f"{t} in_x, {IO} in_z"))


def test_c36_offset_past_4gib():
    body = blob_const("w", "768, 768, 1, 1", offset=1 << 32) + RELU
    refused("ANE-C36", program(body))
