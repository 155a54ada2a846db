"""Property tests of the MIL front end through Program.compile: whatever text (and
whatever weight bytes) it is given, it either compiles or raises an OrionError
subclass with a message; it never crashes the process or raises anything else.

The inputs are garbage, soups of MIL tokens, and mutations of the seed programs of
the libFuzzer corpus (tests/fuzz/corpus), which reach the verifier far more often
than random text does. The C harness (tests/fuzz/fuzz_mil_parser.c) does the same at
millions of inputs under ASan; this keeps a smaller dose in every test run."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orion.errors import OrionError
from orion.runtime import Program
from orion.runtime.blob import blob_bytes

pytestmark = pytest.mark.native

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
SEEDS = sorted(p.read_text(encoding="utf-8") for p in CORPUS.glob("*.mil"))
TOKENS = [
    "program", "(", ")", "1.3", "[", "]", "{", "}", "<", ">", ",", "=", ";", "->", "-",
    "func", "main", "ios18", "tensor", "fp16", "fp32", "int32", "bool", "string", "uint64",
    "const", "name", "val", "BLOBFILE", "path", "offset", "x", "y", "z", "true", "false",
    "inf", "nan", "0", "1", "32", "768", "-1", "0x1p-3", "1e-4", '"x"', '"@model_path/w.bin"',
    "buildInfo", "dict", "relu", "conv", "matmul", "split", "concat", "//", "\n", "\"", "\\",
    "\0", "2147483648", "99999999999999999999", "[1, 768, 1, 32]",
]
WKEY = "@model_path/weights/w.bin"
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def compile_or_refuse(text: str, weights: dict[str, bytes] | None = None) -> None:
    try:
        prog = Program.compile(text, weights=weights or {}, backend="vane")
    except OrionError as e:
        assert str(e), "an OrionError must carry a message"
        return
    prog.release()


@st.composite
def mutated_seed(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 24)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        piece = draw(st.sampled_from(TOKENS) | st.text(max_size=6))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + piece + text[i:]
        elif kind == "replace":
            text = text[:i] + piece + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


def test_seed_corpus_is_present():
    assert len(SEEDS) >= 4


@SETTINGS
@given(st.text(max_size=400))
def test_arbitrary_text(text):
    compile_or_refuse(text)


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=80))
def test_token_soup(tokens):
    compile_or_refuse(" ".join(tokens))


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_token_soup_after_a_valid_header(tokens):
    head = "program(1.3)\n{\n func main<ios18>(tensor<fp16, [1, 768, 1, 32]> x) {\n"
    compile_or_refuse(head + " ".join(tokens))


@SETTINGS
@given(mutated_seed())
def test_mutated_seed_programs(text):
    compile_or_refuse(text)


@SETTINGS
@given(st.binary(max_size=512))
def test_garbage_weight_file(data):
    conv = next(s for s in SEEDS if "BLOBFILE" in s)
    compile_or_refuse(conv, {WKEY: data})


@SETTINGS
@given(st.integers(0, 20), st.integers(0, 255))
def test_corrupted_weight_file(position, value):
    # a valid blob with one byte of its headers changed
    conv = next(s for s in SEEDS if "BLOBFILE" in s)
    data, _ = blob_bytes({"w": np.zeros((768, 768, 1, 1), np.float16)})
    raw = bytearray(data)
    raw[position if position < 8 else 64 + position] = value
    compile_or_refuse(conv, {WKEY: bytes(raw)})


def test_the_seeds_compile_where_they_should():
    # every seed but the deliberately broken one is a valid program
    conv_weights, _ = blob_bytes({"w": np.zeros((768, 768, 1, 1), np.float16)})
    for path in sorted(CORPUS.glob("*.mil")):
        text = path.read_text(encoding="utf-8")
        if path.name == "errors.mil":
            with pytest.raises(OrionError):
                Program.compile(text, weights={}, backend="vane")
            continue
        own = CORPUS.parent / "weights" / f"{path.stem}.bin"   # a seed's own weight file
        weights = {WKEY: own.read_bytes() if own.exists() else conv_weights} \
            if "BLOBFILE" in text else {}
        Program.compile(text, weights=weights, backend="vane").release()
