import re

import numpy as np
import pytest

from orion.ir import Graph, composites
from orion.ir.compile import lower_graph
from orion.ir.legalize import legalize_graph, legalize_program
from orion.ir.mil import (
    check_named_arguments,
    emit,
    fp16_text,
    lower,
    name_literal_arguments,
    weight_key,
)
from orion.ir.program import program_from_graph
from orion.runtime.blob import BlobFile

STMT = re.compile(r'^\s+(tensor<\w+, \[[\d, ]*\]>|\w+) (\w+) = (\w+)\((.*)\)'
                  r'\[name = string\("(\w+)"\)(.*)\];$')


def mlp_graph(seed=0):
    rng = np.random.default_rng(seed)
    g = Graph("mlp")
    x = g.input("x", (1, 64, 1, 96))
    h = composites.layer_norm(g, x, rng.standard_normal(64), rng.standard_normal(64))
    q = g.reshape(h, (1, 4, 16, 96))
    s = g.softmax(g.matmul(q, q, transpose_x=True), axis=-1)
    h = g.add(h, g.reshape(g.matmul(q, s), (1, 64, 1, 96)))
    h = g.gelu(composites.linear(g, h, rng.standard_normal((128, 64)), rng.standard_normal(128)))
    g.output("y", composites.linear(g, h, rng.standard_normal((64, 128)), None, name="out"))
    g.output("z", g.rsqrt(g.add(g.reduce_sum(g.mul(x, x), 1), 1.0)))
    return g


def legal_program(g):
    return legalize_program(program_from_graph(legalize_graph(g), "prog"))


def test_text_shape():
    em = emit(legal_program(mlp_graph()))
    lines = em.mil.splitlines()
    assert lines[0] == "program(1.3)"
    assert lines[1].startswith('[buildInfo = dict<string, string>({{"coremlc-component-MIL", '
                               '"3510.2.1"}, {"coremlc-version", "3505.4.1"}')
    assert lines[3] == "    func main<ios18>(tensor<fp16, [1, 256, 1, 96]> in_00) {"  # padded, C23
    assert lines[-2] == "    } -> (out_00, out_01);"
    body = lines[4:-2]
    names = []
    for line in body:
        m = STMT.match(line)
        assert m, line
        assert m.group(2) == m.group(5)   # every statement is named for its variable
        names.append(m.group(2))
    assert len(names) == len(set(names))
    ops = {STMT.match(line).group(3) for line in body}
    assert {"conv", "matmul", "clip", "pow", "tanh", "softmax", "reduce_mean"} <= ops
    assert not ops & {"gelu", "rsqrt", "concat"}
    assert not any("bias" in line for line in body if " = conv(" in line)   # ANE-C05


def test_every_argument_is_a_named_const():
    p = legal_program(mlp_graph())
    stmts, _, _ = lower(p)
    before = check_named_arguments(stmts)
    assert before and all(v.startswith("ANE-C04") for v in before)
    assert any("transpose_x" in v for v in before)
    after = name_literal_arguments(stmts)
    assert check_named_arguments(after) == []
    em = emit(p)
    for line in em.mil.splitlines()[4:-2]:
        if "= const()" in line:
            continue
        args = line.split("(", 1)[1].rsplit(")[name", 1)[0]
        for arg in args.split(", "):
            assert re.fullmatch(r"\w+ = \w+", arg), f"inline argument in: {line}"


def test_blobfile_offsets_are_metadata_offsets(tmp_path):
    em = emit(legal_program(mlp_graph()))
    key = weight_key("prog")
    assert list(em.weights) == [key] == sorted({k for k, _ in em.weight_offsets.values()})
    path = tmp_path / "w.bin"
    path.write_bytes(em.weights[key])
    refs = re.findall(r'tensor<fp16, \[([\d, ]+)\]>\(BLOBFILE\(path = string\("([^"]+)"\), '
                      r'offset = uint64\((\d+)\)\)\)', em.mil)
    assert len(refs) == len(em.weight_offsets) == 5   # ln gamma, beta; 2 weights, 1 bias
    with BlobFile(path) as blob:
        entries = {e.metadata_offset: e for e in blob.entries()}
    for shape, ref_key, offset in refs:
        assert ref_key == key
        e = entries[int(offset)]
        assert e.nbytes == 2 * int(np.prod([int(d) for d in shape.split(", ")]))


def test_emission_is_deterministic():
    a = lower_graph(mlp_graph(seed=3))
    b = lower_graph(mlp_graph(seed=3))
    assert [e.mil for e in a.emitted] == [e.mil for e in b.emitted]
    assert [e.weights for e in a.emitted] == [e.weights for e in b.emitted]
    c = lower_graph(mlp_graph(seed=4))   # other weights: same text, other bytes
    assert [e.mil for e in c.emitted] == [e.mil for e in a.emitted]
    assert [e.weights for e in c.emitted] != [e.weights for e in a.emitted]


def test_weight_keys_are_unique_per_program():
    g = Graph("two")
    x = g.input("x", (1, 64, 1, 384))
    h = g.tanh(composites.linear(g, x, np.eye(64), None, name="a"))
    g.output("y", g.tanh(composites.linear(g, h, np.eye(64), None, name="b")))
    from orion.ir.partition import DeviceLimits

    low = lower_graph(g, DeviceLimits(max_ops=2))
    keys = [k for e in low.emitted for k in e.weights]
    assert len(low.emitted) == 2 and len(set(keys)) == 2


def test_fp16_literals_are_exact():
    for v in (0.5, -0.5, 1e-5, 0.044715, 65504.0, -30000.0, 1 / 3):
        t = fp16_text(v)
        assert np.float16(float(t)) == np.float16(v)
        assert float(t) == float(np.float16(v))
    with pytest.raises(ValueError, match="ANE-C41"):
        fp16_text(1e6)


def test_unlegalized_ops_are_refused():
    g = Graph("t")
    g.output("y", g.gelu(g.input("x", (1, 64, 1, 384))))
    with pytest.raises(ValueError, match="legalize the graph first"):
        emit(program_from_graph(g))


def big_linear_program(name, weights, bias_seed=0):
    """A chain of 256x256 linears (128 KiB of fp16 each) with a small bias each."""
    rng = np.random.default_rng(bias_seed)
    g = Graph(name)
    h = g.input("x", (1, 256, 1, 64))
    for i, w in enumerate(weights):
        h = g.tanh(composites.linear(g, h, w, rng.standard_normal(256), name=f"l{i}"))
    g.output("y", h)
    return legalize_program(program_from_graph(legalize_graph(g), name))


def test_every_program_keeps_its_weights_in_one_file(tmp_path):
    """One weight file per program, inference or not (macOS 27 verifies one), its
    entries at 64-byte-aligned offsets that the MIL's BLOBFILE references name."""
    rng = np.random.default_rng(0)
    many = [rng.standard_normal((256, 256)) / 16 for _ in range(17)]
    for share in (False, True):
        em = emit(big_linear_program("many", many), share_weights=share)
        assert list(em.weights) == [weight_key("many")]
        offsets = {off for _, off in em.weight_offsets.values()}
        assert len(offsets) == 34 and all(off % 64 == 0 for off in offsets)   # 17 w + 17 b
        assert set(re.findall(r'path = string\("([^"]+)"\)', em.mil)) == {weight_key("many")}
        refs = {int(o) for o in re.findall(r"offset = uint64\((\d+)\)", em.mil)}
        assert refs == offsets
        path = tmp_path / f"many-{share}.bin"
        path.write_bytes(em.weights[weight_key("many")])
        with BlobFile(path) as blob:
            assert {e.metadata_offset for e in blob.entries()} == offsets


def test_share_weights_stores_equal_tensors_once_in_the_file():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)) / 16
    plain = emit(big_linear_program("rep", [w, w]))
    shared = emit(big_linear_program("rep", [w, w]), share_weights=True)
    (a, b) = (shared.weight_offsets[f"l{i}_w"] for i in range(2))
    assert a == b                                          # one entry for both
    assert len(plain.weights[weight_key("rep")]) - len(shared.weights[weight_key("rep")]) \
        == 64 + 256 * 256 * 2                              # one metadata header + the data
    assert set(plain.weight_offsets) == set(shared.weight_offsets)
