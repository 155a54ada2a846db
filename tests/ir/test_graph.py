import numpy as np
import pytest

from orion.ir import IR_OPS, Graph, Op, ShapeError
from orion.ir.dump import dump_graph
from orion.ir.graph import prune, rebuild


def test_op_set_is_the_papers_27():
    names = {op.value for op in IR_OPS}
    assert len(names) == 27
    assert {"gelu", "clip"}.isdisjoint(names)
    assert {"conv1x1", "rsqrt", "concat", "split", "pad", "slice", "identity"} <= names


def test_builder_reads_like_math_and_infers_shapes():
    g = Graph("t")
    x = g.input("x", (1, 8, 1, 32))
    w = g.const(np.ones((4, 8, 1, 1)), name="w")
    y = g.conv1x1(x, w) * 0.5 + 1.0
    assert y.shape == (1, 4, 1, 32)
    q = g.reshape(y, (1, 2, 2, 32))
    s = g.matmul(q, q, transpose_y=True)
    assert s.shape == (1, 2, 2, 2)
    r = g.reduce_mean(x, 1)
    assert r.shape == (1, 1, 1, 32)
    assert g.reduce_sum(x, (1, 3), keep_dims=False).shape == (1, 1)
    parts = g.split(x, [3, 5], axis=1)
    assert [p.shape for p in parts] == [(1, 3, 1, 32), (1, 5, 1, 32)]
    assert g.pad(x, ((0, 0), (0, 2), (0, 0), (0, 32))).shape == (1, 10, 1, 64)
    assert g.slice(x, (0, 2, 0, 0), (1, 4, 1, 16)).shape == (1, 4, 1, 16)
    assert g.reshape(x, (1, -1, 1, 16)).shape == (1, 16, 1, 16)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda g, x: g.add(x, g.input("z", (1, 3, 1, 32))), "do not broadcast (axis 1: 8 vs 3)"),
        (lambda g, x: g.matmul(x, x), "inner dimensions differ"),
        (lambda g, x: g.reshape(x, (1, 7, 1, 32)), "cannot reshape [1, 8, 1, 32]"),
        (lambda g, x: g.transpose(x, (0, 1, 1, 3)), "is not a permutation"),
        (lambda g, x: g.conv1x1(x, g.const(np.ones((4, 3, 1, 1)))), "has 3 input channels"),
        (lambda g, x: g.conv1x1(x, x), "the weight must be a const"),
        (lambda g, x: g.split(x, [3, 3], axis=1), "do not sum"),
        (lambda g, x: g.slice(x, (0, 6, 0, 0), (1, 4, 1, 32)), "is not inside"),
        (lambda g, x: g.softmax(x, axis=4), "axis 4 is out of range"),
        (lambda g, x: g.add(x, g.cast(x, "fp32")), "dtypes differ"),
    ],
)
def test_shape_errors_are_clear(build, message):
    g = Graph("t")
    x = g.input("x", (1, 8, 1, 32))
    with pytest.raises(ShapeError) as e:
        build(g, x)
    assert message in str(e.value)


def test_shape_error_names_the_operands():
    g = Graph("t")
    x = g.input("x", (1, 8, 1, 32))
    with g.scope("blk"):
        with pytest.raises(ShapeError, match=r"building 'blk_matmul' from %x: fp16\[1,8,1,32\]"):
            g.matmul(x, x)


def test_dump_is_readable():
    g = Graph("mlp")
    x = g.input("x", (1, 8, 1, 32))
    with g.composite("silu"):
        y = g.mul(x, g.sigmoid(x))
    g.output("y", y)
    text = dump_graph(g)
    assert text.splitlines()[0] == "graph mlp(%x: fp16[1,8,1,32]) {"
    assert "%silu_sigmoid: fp16[1,8,1,32] = sigmoid(%x)  # silu#0" in text
    assert text.endswith("} -> (y = %silu_mul)")


def test_names_are_unique_and_values_belong_to_one_graph():
    g, h = Graph("a"), Graph("b")
    x = g.input("x", (1, 8, 1, 32))
    a, b = g.relu(x), g.relu(x)
    assert a.name != b.name
    with pytest.raises(ValueError, match="belongs to graph a"):
        h.relu(x)
    with pytest.raises(ValueError, match="already has a value"):
        g.input("x", (1, 8, 1, 32))


def test_rebuild_and_prune():
    g = Graph("t")
    x = g.input("x", (1, 8, 1, 32))
    g.tanh(x)  # dead
    g.output("y", g.relu(x))

    def relu_to_identity(new, node, ins):
        return [new.identity(ins[0])] if node.op is Op.RELU else None

    r = rebuild(g, relu_to_identity)
    assert [n.op for n in r.nodes] == [Op.INPUT, Op.TANH, Op.IDENTITY]
    p = prune(r)
    assert [n.op for n in p.nodes] == [Op.INPUT, Op.IDENTITY]
    assert list(p.outputs) == ["y"]


def test_const_takes_a_frozen_array_as_is_and_copies_anything_writable():
    """A model layer frozen by its loader is not held twice; a writable array, or a
    read-only view of one, is copied, so a later write cannot reach the graph."""
    g = Graph("c")
    frozen = np.ones((4, 8), np.float16)
    frozen.setflags(write=False)
    assert np.shares_memory(g.const(frozen.reshape(4, 8, 1, 1)).node.attrs["value"], frozen)
    writable = np.ones((4, 8), np.float16)
    view = writable[:]
    view.setflags(write=False)
    for source in (writable, view):
        kept = g.const(source).node.attrs["value"]
        writable[0, 0] = 5
        assert not np.shares_memory(kept, writable) and kept[0, 0] == 1
        writable[0, 0] = 1
    as_fp32 = np.ones(3, np.float64)
    as_fp32.setflags(write=False)
    assert g.const(as_fp32).node.attrs["value"].dtype == np.float32   # converted: a copy
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="non-finite"):
            g.const(np.array([1.0, bad], np.float16))
        # fp16 is checked a chunk at a time by its bits: a bad value past the first
        # chunk, in a strided view, and in fp32 are all found
        big = np.zeros(3 * (1 << 20) + 5, np.float16)
        big[-2] = bad
        for arr in (big, big[1::2], big.astype(np.float32)):   # [-2] is odd
            with pytest.raises(ValueError, match="non-finite"):
                g.const(arr)
    extremes = np.array([65504, -65504, 6e-8, -0.0], np.float16)   # finite, all of them
    assert np.array_equal(g.const(extremes).node.attrs["value"], extremes)
