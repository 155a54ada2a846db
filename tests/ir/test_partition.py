import numpy as np
import pytest

from orion.ir import Graph, Op
from orion.ir.legalize import check_no_concat, check_program, legalize_graph, legalize_program
from orion.ir.partition import (
    DeviceLimits,
    HostConcat,
    PartitionError,
    execute,
    partition,
    reference_runner,
)
from orion.ir.program import from_device, to_device
from orion.ir.reference import evaluate

from .blocks import gpt2_block_reference, gpt2_stack

RNG = np.random.default_rng(4)


def legal_runner(p, feeds):
    """Legalizes a program and evaluates it the way the device is fed."""
    q = legalize_program(p)
    dev = {s.name: to_device(s, feeds[s.source], np.zeros(s.device_shape, np.float32))
           for s in q.inputs}
    out = evaluate(q.graph, dev)
    return {s.source: from_device(s, out[s.name]) for s in q.outputs}


def test_split_at_concat():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    a, b = g.relu(x), g.tanh(x)
    c = g.concat([a, b], axis=1)
    g.output("y", g.mul(c, 2.0))
    assert [v.constraint for v in check_no_concat(g)] == ["ANE-C01"]
    plan = partition(legalize_graph(g))
    kinds = [type(s).__name__ for s in plan.stages]
    assert kinds == ["ProgramIR", "HostConcat", "ProgramIR"]
    for p in plan.programs:
        assert check_no_concat(p.graph) == []
        assert check_program(legalize_program(p)) == []
    concat = plan.stages[1]
    assert isinstance(concat, HostConcat) and concat.axis == 1
    assert [s.source for s in plan.programs[0].outputs] == concat.inputs
    xv = RNG.standard_normal((1, 64, 1, 384)).astype(np.float32)
    want = evaluate(g, {"x": xv})["y"]
    np.testing.assert_allclose(execute(plan, {"x": xv}, legal_runner)["y"], want,
                               rtol=2e-3, atol=2e-3)


def test_weight_limit_cuts_between_layers():
    g, weights = gpt2_stack(3, 64, 256, 4, 32)
    per_layer = 2 * sum(w.size for w in vars(weights[0]).values()) + 2 * 32 * 32
    plan = partition(legalize_graph(g), DeviceLimits(max_weight_bytes=int(per_layer * 1.5)))
    assert len(plan.programs) == 3
    for p in plan.programs:   # each program takes and gives only the residual stream
        assert [s.shape for s in p.inputs] == [(1, 64, 1, 32)]
        assert [s.shape for s in p.outputs] == [(1, 64, 1, 32)]
    xv = RNG.standard_normal((1, 64, 1, 32)).astype(np.float32)
    want = xv
    for w in weights:
        want = gpt2_block_reference(want, w, 4)
    got = execute(plan, {"x": xv}, reference_runner)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_op_limit_and_crossing_values():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    h = x
    for _ in range(12):
        h = g.add(g.tanh(h), x)   # x crosses every cut
    g.output("y", h)
    plan = partition(g, DeviceLimits(max_ops=5))
    assert all(len([n for n in p.graph.nodes if n.op not in (Op.INPUT, Op.CONST)]) <= 5
               for p in plan.programs)
    assert len(plan.programs) == 5
    xv = RNG.standard_normal((1, 64, 1, 384)).astype(np.float32)
    np.testing.assert_allclose(execute(plan, {"x": xv}, legal_runner)["y"],
                               evaluate(g, {"x": xv})["y"], rtol=2e-3, atol=2e-3)


def test_a_node_over_the_limit_is_an_error():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    g.output("y", g.conv1x1(x, g.const(np.zeros((512, 64, 1, 1)))))
    with pytest.raises(PartitionError, match="65536 bytes of weights"):
        partition(g, DeviceLimits(max_weight_bytes=1000))


def test_program_count_limit():
    g = Graph("t")
    h = g.input("x", (1, 64, 1, 384))
    for _ in range(10):
        h = g.tanh(h)
    g.output("y", h)
    with pytest.raises(PartitionError, match="ANE-C34"):
        partition(g, DeviceLimits(max_ops=1, max_programs=4))


def test_outputs_that_are_inputs_or_consts_are_resolved_on_the_host():
    g = Graph("t")
    x = g.input("x", (1, 64, 1, 384))
    g.output("same", x)
    g.output("c", g.const(np.ones((1, 4, 1, 1))))
    g.output("y", g.relu(x))
    plan = partition(g)
    xv = RNG.standard_normal((1, 64, 1, 384)).astype(np.float32)
    r = execute(plan, {"x": xv}, legal_runner)
    np.testing.assert_array_equal(r["same"], xv)
    np.testing.assert_array_equal(r["c"], np.ones((1, 4, 1, 1)))
