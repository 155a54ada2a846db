"""Each pass: the constraint is violated before, satisfied after, and the values the
graph computes are unchanged."""

import numpy as np
import pytest

from orion.ir import Graph, Op, composites
from orion.ir.legalize import (
    FP16_MAX,
    GRAPH_PASSES,
    PROGRAM_PASSES,
    LegalizeError,
    check_fp16_clamps,
    check_io_layout,
    check_io_names,
    check_io_surfaces,
    check_no_concat,
    check_no_gelu,
    check_no_rsqrt,
    check_outputs_materialized,
    insert_fp16_clamps,
    layout_channel_first,
    legalize_graph,
    legalize_program,
    materialize_outputs,
    order_io_by_name,
    pad_io_surfaces,
    rewrite_gelu_tanh,
    rewrite_rsqrt_as_pow,
)
from orion.ir.program import from_device, program_from_graph, to_device
from orion.ir.reference import evaluate

RNG = np.random.default_rng(1)


def feeds_for(g):
    return {v.name: RNG.standard_normal(v.shape).astype(np.float32) for v in g.inputs}


def run_program(p, feeds):
    """Evaluates a program the way the device would be fed: each model value placed
    in its device tensor, each output read back out of it."""
    dev = {s.name: to_device(s, feeds[s.source], np.zeros(s.device_shape, np.float32))
           for s in p.inputs}
    out = evaluate(p.graph, dev)
    return {s.source: from_device(s, out[s.name]) for s in p.outputs}


def ids(violations):
    return sorted({v.constraint for v in violations})


def test_rewrite_gelu_tanh():
    g = Graph("t")
    x = g.input("x", (1, 16, 1, 32))
    g.output("y", g.gelu(x))
    assert ids(check_no_gelu(g)) == ["ANE-C02"]
    r = rewrite_gelu_tanh(g)
    assert check_no_gelu(r) == []
    assert Op.TANH in {n.op for n in r.nodes}
    f = feeds_for(g)
    np.testing.assert_allclose(evaluate(r, f)["y"], evaluate(g, f)["y"], rtol=1e-6)


def test_rewrite_rsqrt_as_pow():
    g = Graph("t")
    x = g.input("x", (1, 16, 1, 32))
    g.output("y", g.rsqrt(g.add(g.mul(x, x), 1.0)))
    assert ids(check_no_rsqrt(g)) == ["ANE-C03"]
    r = rewrite_rsqrt_as_pow(g)
    assert check_no_rsqrt(r) == []
    (pw,) = [n for n in r.nodes if n.op is Op.POW]
    assert float(pw.inputs[1].node.attrs["value"]) == -0.5
    f = feeds_for(g)
    np.testing.assert_allclose(evaluate(r, f)["y"], evaluate(g, f)["y"], rtol=1e-6)


def test_insert_fp16_clamps_before_softmax_and_norms():
    g = Graph("t")
    x = g.input("x", (1, 16, 1, 32))
    h = composites.layer_norm(g, x, np.ones(16), np.zeros(16))
    h = composites.rms_norm(g, h, np.ones(16))
    g.output("y", g.softmax(h, axis=1))
    before = check_fp16_clamps(g)
    assert ids(before) == ["ANE-C41"]
    assert len({v.where for v in before}) >= 3   # the softmax and both norms
    r = insert_fp16_clamps(g)
    assert check_fp16_clamps(r) == []
    clips = [n for n in r.nodes if n.op is Op.CLIP]
    assert len(clips) == 3 and all(n.attrs["hi"] == FP16_MAX for n in clips)
    assert insert_fp16_clamps(r).nodes.__len__() == len(r.nodes)   # idempotent
    f = feeds_for(g)
    np.testing.assert_allclose(evaluate(r, f)["y"], evaluate(g, f)["y"], rtol=1e-6)
    f["x"][0, 3, 0, 5] = np.inf   # an overflowed activation is caught, not propagated
    assert np.isfinite(evaluate(r, f)["y"][..., :5]).all()


def test_concat_is_found():
    g = Graph("t")
    x = g.input("x", (1, 16, 1, 32))
    g.output("y", g.concat([x, x], axis=1))
    assert ids(check_no_concat(g)) == ["ANE-C01"]   # fixed by partition, see test_partition


def test_materialize_outputs():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    h = g.relu(x)
    g.output("a", h)
    g.output("b", g.tanh(h))   # a is also read inside
    g.output("c", h)           # the same value twice
    g.output("d", x)           # an input returned unchanged
    p = program_from_graph(g)
    assert ids(check_outputs_materialized(p)) == ["ANE-C06"]
    assert len(check_outputs_materialized(p)) == 3
    q = materialize_outputs(p)
    assert check_outputs_materialized(q) == []
    f = feeds_for(g)
    want, got = evaluate(g, f), run_program(q, f)
    for k in "abcd":
        np.testing.assert_array_equal(got[k], want[k])


def test_layout_channel_first():
    g = Graph("t")
    x = g.input("x", (1, 4, 64, 32))                # [1, H, S, D]
    v = g.input("v", (96, 128), "fp32")
    g.output("y", g.mul(x, 2.0))
    g.output("z", g.reduce_sum(g.cast(v, "fp16"), (0, 1), keep_dims=False))   # a scalar
    p = program_from_graph(g)
    assert ids(check_io_layout(p)) == ["ANE-C29"]
    assert len(check_io_layout(p)) == 4
    q = layout_channel_first(p)
    assert check_io_layout(q) == []
    assert q.graph.input_named("x").shape == (1, 256, 1, 32)
    assert q.graph.input_named("v").shape == (1, 96, 1, 128)
    assert q.graph.outputs["z"].shape == (1, 1, 1, 1)
    f = feeds_for(g)
    want, got = evaluate(g, f), run_program(q, f)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-3)
    np.testing.assert_allclose(got["z"], want["z"], rtol=1e-2)


def test_pad_io_surfaces():
    g = Graph("t")
    a = g.input("a", (1, 8, 1, 40))      # width not a multiple of 32, and tiny
    b = g.input("b", (1, 300, 1, 96))    # a different size
    g.output("y", g.add(a, g.reduce_mean(g.slice(b, (0, 0, 0, 0), (1, 8, 1, 40)), 1)))
    g.output("s", g.reduce_sum(b, 1))    # [1, 1, 1, 96]: 192 bytes
    p = layout_channel_first(program_from_graph(g))
    assert ids(check_io_surfaces(p)) == ["ANE-C17", "ANE-C18", "ANE-C22", "ANE-C23"]
    q = pad_io_surfaces(p)
    assert check_io_surfaces(q) == []
    shapes = {v.shape for v in q.graph.inputs}
    assert shapes == {(1, 300, 1, 96)}
    assert {v.shape for v in q.graph.outputs.values()} == {(1, 256, 1, 96)}
    assert all(s.device_nbytes >= 49152 for s in q.inputs + q.outputs)
    f = feeds_for(g)
    want, got = evaluate(g, f), run_program(q, f)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-3)


def test_pad_io_surfaces_reaches_width_32():
    g = Graph("t")
    g.output("y", g.relu(g.input("x", (1, 2000, 1, 16))))
    p = layout_channel_first(program_from_graph(g))
    assert ids(check_io_surfaces(p)) == ["ANE-C22", "ANE-C24"]
    q = pad_io_surfaces(p)
    assert check_io_surfaces(q) == [] and q.inputs[0].device_shape == (1, 2000, 1, 32)


def test_order_io_by_name():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    m = g.input("mask", (1, 64, 1, 384))
    g.output("y2", g.add(x, m))
    g.output("y", g.sub(x, m))
    p = program_from_graph(g)
    assert ids(check_io_names(p)) == ["ANE-C19", "ANE-C20"]
    q = order_io_by_name(p)
    assert check_io_names(q) == []
    assert [v.name for v in q.graph.inputs] == ["in_00", "in_01"]
    assert list(q.graph.outputs) == ["out_00", "out_01"]
    assert [s.source for s in q.inputs] == ["x", "mask"]
    assert [s.source for s in q.outputs] == ["y2", "y"]
    f = feeds_for(g)
    want, got = evaluate(g, f), run_program(q, f)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_order_io_by_name_survives_internal_names_like_io():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    h = g.relu(x, name="in_00")   # an internal node that would take a device name
    g.output("y", g.tanh(h))
    q = order_io_by_name(program_from_graph(g))
    assert q.graph.inputs[0].name == "in_00"
    f = feeds_for(g)
    np.testing.assert_array_equal(run_program(q, f)["y"], evaluate(g, f)["y"])


def test_pass_manager_order_and_ids():
    assert [p.name for p in GRAPH_PASSES] == [
        "rewrite_gelu_tanh", "rewrite_rsqrt_as_pow", "insert_fp16_clamps"]
    assert [p.name for p in PROGRAM_PASSES] == [
        "materialize_outputs", "layout_channel_first", "pad_io_surfaces", "order_io_by_name"]
    for p in GRAPH_PASSES + PROGRAM_PASSES:
        assert p.constraints and all(c.startswith("ANE-C") and len(c) == 7
                                     for c in p.constraints)


def test_legalize_whole_pipeline_preserves_values():
    g = Graph("t")
    x = g.input("x", (1, 48, 1, 40), "fp32")
    h = composites.layer_norm(g, g.cast(x, "fp16"), np.ones(48), np.zeros(48))
    h = g.gelu(composites.linear(g, h, RNG.standard_normal((24, 48)) * 0.1, np.zeros(24)))
    g.output("y", g.softmax(g.rsqrt(g.add(g.mul(h, h), 1.0)), axis=1))
    lg = legalize_graph(g)
    p = legalize_program(program_from_graph(lg))
    assert p.inputs[0].device_shape == (1, 384, 1, 64)
    f = feeds_for(g)
    np.testing.assert_allclose(run_program(p, f)["y"], evaluate(g, f)["y"], rtol=2e-3,
                               atol=1e-4)


def test_legalize_program_refuses_concat():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    g.output("y", g.concat([x, x], axis=1))
    with pytest.raises(LegalizeError, match="ANE-C01"):
        legalize_program(program_from_graph(g))
