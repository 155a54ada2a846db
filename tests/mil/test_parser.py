"""The MIL parser through Program.compile: syntax errors are ParseError with the line
and column of the offending token; the forms of ane-facts §2 that working programs
use all parse; names and types that parse but do not agree are refused by the
verifier, again with line and column."""

import re

import pytest

from orion.errors import InvalidArgumentError, OrionError, ParseError
from orion.runtime import Program

pytestmark = pytest.mark.native

IO = "tensor<fp16, [1, 768, 1, 32]>"
HEADER = ("program(1.3)\n"
          '[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, '
          '{"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, '
          '{"coremltools-version", "9.0"}})]\n')


def program(*body: str, inputs: str = f"{IO} in_x", outputs: str = "out_y") -> str:
    """Lines: 1 program, 2 buildInfo, 3 '{', 4 func, 5.. body (8 spaces in), then
    '} -> (...)', '}' and an empty last line."""
    lines = "".join(f"        {line}\n" for line in body)
    return HEADER + "{\n" + f"    func main<ios18>({inputs}) {{\n" + lines + \
        f"    }} -> ({outputs});\n" + "}\n"


RELU = f'{IO} out_y = relu(x = in_x)[name = string("out_y")];'


def compile_(text: str) -> None:
    Program.compile(text, weights={}, backend="vane").release()


def parse_error(text: str, line: int, column: int, says: str) -> None:
    with pytest.raises(ParseError) as info:
        compile_(text)
    msg = str(info.value)
    assert msg.startswith(f"line {line}, column {column}: "), msg
    assert says in msg, msg


# ---- what parses --------------------------------------------------------------


def test_minimal_program_with_the_buildinfo_line():
    compile_(program(RELU))


def test_without_buildinfo_with_comments_and_crlf():
    text = ("// a comment before the program\r\nprogram(1.3) // trailing\r\n{\r\n"
            f"  func main<ios18>({IO} in_x) {{ // after the brace\r\n"
            f"    {RELU}\r\n  }} -> (out_y);\r\n}}\r\n")
    compile_(text)


@pytest.mark.parametrize("literal", [
    "fp16(0.5)", "fp16(-0.5)", "fp16(0x1p-3)", "fp16(-0x1.8p1)", "fp16(1e-4)", "fp16(.25)",
    "fp16(65504)", "fp16(-65504)", "fp16(inf)", "fp16(-inf)", "fp16(3)",
])
def test_scalar_float_literals(literal):
    compile_(program(f'fp16 k = const()[name = string("k"), val = {literal}];',
                     f'{IO} out_y = mul(x = in_x, y = k)[name = string("out_y")];'))


def test_split_results_bare_and_in_parentheses():
    whole = "tensor<fp16, [1, 1536, 1, 32]>"
    common = ['int32 ax = const()[name = string("ax"), val = int32(1)];',
              'int32 ns = const()[name = string("ns"), val = int32(2)];']
    for lhs in (f"{IO} out_a, {IO} out_b", f"({IO} out_a, {IO} out_b)"):
        compile_(program(*common, f'{lhs} = split(x = in_x, axis = ax, num_splits = ns)'
                                  '[name = string("sp")];', inputs=f"{whole} in_x",
                         outputs="out_a, out_b"))


def test_tensor_literals_flat_and_nested_and_negative():
    compile_(program(
        'tensor<int32, [4]> sh = const()[name = string("sh"), val = '
        'tensor<int32, [4]>([1, 768, 1, -1])];',
        'tensor<int32, [2, 2]> m = const()[name = string("m"), val = '
        'tensor<int32, [2, 2]>([[1, 2], [-3, 4]])];',
        f'{IO} out_y = reshape(shape = sh, x = in_x)[name = string("out_y")];'))


# ---- syntax errors, with where --------------------------------------------------


def test_blank_text():
    parse_error("  \n // nothing\n", 3, 1, "expected 'program', found end of input")


def test_missing_version():
    parse_error("program()\n", 1, 9, "a version such as 1.3")


def test_missing_semicolon_points_at_the_next_token():
    text = program(RELU.rstrip(";"), RELU.replace("out_y", "out_z"))
    parse_error(text, 6, 9, "expected ';' at the end of the statement, found 'tensor'")


def test_unknown_type():
    parse_error(program("float16 k = const()[name = string(\"k\"), val = fp16(1)];"), 5, 9,
                "expected a type")


def test_zero_dimension():
    text = program(inputs="tensor<fp16, [1, 0, 1, 32]> in_x")
    parse_error(text, 4, 39, "a dimension must be at least 1")


def test_symbolic_dimension():
    text = program(inputs="tensor<fp16, [1, C, 1, S]> in_x")
    parse_error(text, 4, 39, "expected a dimension")


def test_rank_above_8():
    shape = ", ".join(["1"] * 9)
    text = program(inputs=f"tensor<fp16, [{shape}]> in_x")
    parse_error(text, 4, 60, "rank is above 8")


def test_misplaced_quote():
    # the string runs from "s to the next quote; the x after it is where it breaks
    parse_error(program('string s = const()[name = string("s), val = string("x")];'), 5, 61,
                "expected ')' to close the literal, found 'x'")


def test_string_with_a_newline():
    parse_error(program('string s = const()[name = string("s', '")];'), 5, 42,
                "unterminated string")


@pytest.mark.parametrize("literal, says", [
    ("fp16(1e5)", "out of range"),
    ("fp16(1.2.3)", "malformed number"),
    ("fp16(0x1)", "malformed number"),
    ("fp16(true)", "expected a number"),
    ("int32(1.5)", "plain decimal integer"),
    ("int32(2147483648)", "too large"),
    ("bool(1)", "expected true or false"),
])
def test_bad_literals(literal, says):
    dtype = literal.split("(")[0]
    col = 9 + len(f'{dtype} k = const()[name = string("k"), val = {dtype}(')
    parse_error(program(f'{dtype} k = const()[name = string("k"), val = {literal}];'), 5, col, says)


def test_tensor_literal_element_count():
    text = program('tensor<int32, [4]> sh = const()[name = string("sh"), val = '
                   'tensor<int32, [4]>([1, 2, 3])];')
    parse_error(text, 5, 68, "tensor literal has 3 elements, its type holds 4")


def test_stray_character():
    parse_error(program(RELU + " $"), 5, 9 + len(RELU) + 1, "found unexpected character")


def test_nul_byte():
    parse_error(program(RELU) + "\0", 8, 1, "unexpected character")


def test_non_ascii_identifier():
    parse_error(program(RELU.replace("out_y =", "öut =")), 5, 39, "a result name")


def test_text_after_the_program():
    parse_error(program(RELU) + "program(1.3)\n", 8, 1, "expected end of input")


def test_second_function():
    text = program(RELU)[:-2] + f"    func other<ios18>({IO} a) {{ }} -> (a);\n}}\n"
    parse_error(text, 7, 5, "only one function")


def test_truncated_text_is_a_parse_error():
    text = program(RELU)
    for cut in range(1, len(text) - 2, 7):
        with pytest.raises(ParseError, match=r"^line \d+, column \d+: "):
            compile_(text[:cut])


# ---- parses, but the verifier refuses: still with where --------------------------


@pytest.mark.parametrize("body, says", [
    ([f'{IO} out_y = relu(x = nope)[name = string("out_y")];'],
     "line 5, column 56: relu 'out_y': 'nope' is not defined"),
    ([f'{IO} out_y = frobnicate(x = in_x)[name = string("out_y")];'],
     "line 5, column 9: 'out_y' uses the unknown op 'frobnicate'"),
    (['tensor<fp16, [1, 768, 1, 64]> out_y = relu(x = in_x)[name = string("out_y")];'],
     "line 5, column 9: 'out_y' is declared tensor<fp16, [1, 768, 1, 64]> but relu produces "
     "tensor<fp16, [1, 768, 1, 32]>"),
    ([RELU, RELU], "line 6, column 9: 'out_y' is already defined at line 5"),
    ([f'{IO} out_y = relu(x = in_x);'], "needs the attribute [name = string(\"out_y\")]"),
])
def test_verifier_errors_name_line_and_column(body, says):
    with pytest.raises(InvalidArgumentError) as info:
        compile_(program(*body))
    assert says in str(info.value)


def test_every_failure_is_an_orion_error_with_a_position():
    # a sample of broken texts, each refused with a message that says where
    texts = [program(RELU)[:40], program(RELU).replace("(", "[", 3), program(RELU) + "}"]
    for text in texts:
        with pytest.raises(OrionError) as info:
            compile_(text)
        assert re.match(r"line \d+, column \d+: ", str(info.value)), str(info.value)
