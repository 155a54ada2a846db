"""End to end on vane: graphs of the IR compile, pass vane's verifier, and evaluate to
the numpy fp32 reference within fp16 tolerances."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orion.errors import ConstraintError
from orion.ir import Graph, composites
from orion.ir.compile import compile_graph, lower_graph
from orion.ir.dump import dump_graph
from orion.ir.legalize import (
    PROGRAM_PASSES,
    legalize_graph,
)
from orion.ir.mil import emit
from orion.ir.partition import DeviceLimits
from orion.ir.program import program_from_graph
from orion.ir.reference import evaluate
from orion.runtime import Program

pytestmark = pytest.mark.native

# ---- random graphs ---------------------------------------------------------------------
# Values stay [1, C, 1, S] (reductions are folded straight back in), with magnitudes kept
# near 1, so that the fp16 device and the fp32 reference are comparable op by op.


def _apply(g, draw, pool, rng, c, s):
    x = draw(st.sampled_from(pool))
    y = draw(st.sampled_from(pool))
    kind = draw(st.sampled_from([
        "add", "sub", "mul", "tanh", "sigmoid", "relu", "neg", "identity", "softmax_c",
        "softmax_s", "center", "rmax", "conv", "layer_norm", "rms_norm", "gelu", "silu",
        "rsqrt", "sqrt", "exp", "attention", "transpose", "split", "slice_pad", "concat",
        "bias", "cast"]))
    match kind:
        case "add":
            return g.add(x, y)
        case "sub":
            return g.sub(x, y)
        case "mul":
            return g.mul(g.tanh(x), y)
        case "tanh" | "sigmoid" | "relu" | "neg" | "identity":
            return getattr(g, kind)(x)
        case "softmax_c":
            return g.softmax(x, axis=1)
        case "softmax_s":
            return g.softmax(x, axis=3)
        case "center":
            return g.sub(x, g.reduce_mean(x, 1))
        case "rmax":
            return g.sub(x, g.reduce_max(x, 3))
        case "conv":
            w = rng.standard_normal((c, c)) / np.sqrt(c)
            return composites.linear(g, x, w, None)
        case "cast":   # a detour through fp32 and back
            wide = g.cast(x, "fp32")
            return g.cast(g.mul(g.tanh(wide), g.const(rng.standard_normal((1, c, 1, 1)),
                                                      dtype="fp32")), "fp16")
        case "bias":
            return g.add(x, g.const(rng.standard_normal((1, c, 1, 1))))
        case "layer_norm":
            return composites.layer_norm(g, x, rng.uniform(0.5, 1.5, c), rng.standard_normal(c))
        case "rms_norm":
            return composites.rms_norm(g, x, rng.uniform(0.5, 1.5, c))
        case "gelu":
            return g.gelu(x)
        case "silu":
            return composites.silu(g, x)
        case "rsqrt":
            return g.rsqrt(g.add(g.mul(x, x), 1.0))
        case "sqrt":
            return g.sqrt(g.add(g.mul(x, x), 0.5))
        case "exp":
            return g.exp(g.tanh(x))
        case "attention":
            heads = draw(st.sampled_from([h for h in (1, 2, 4) if c % h == 0]))
            return composites.causal_attention(g, x, y, g.tanh(x), heads)
        case "transpose":   # [1, C, 1, S] -> [S, C]; (C x S)(S x C) -> C x C; then back
            t = g.reshape(g.transpose(x, (0, 3, 2, 1)), (1, 1, s, c))
            yy = g.reshape(g.tanh(y), (1, 1, c, s))
            a = g.mul(g.matmul(yy, t), 1.0 / s)
            return g.reshape(g.matmul(a, yy, transpose_x=True), (1, c, 1, s))
        case "split":
            a, b = g.split(x, [c // 2, c - c // 2], axis=1)
            return g.add(x, g.pad(g.tanh(a), ((0, 0), (0, c - c // 2), (0, 0), (0, 0))))
        case "slice_pad":
            part = g.slice(x, (0, 0, 0, 1), (1, c, 1, s - 1))
            return g.pad(part, ((0, 0), (0, 0), (0, 0), (1, 0)))
        case "concat":
            a = g.slice(x, (0, 0, 0, 0), (1, c // 2, 1, s))
            b = g.slice(y, (0, c // 2, 0, 0), (1, c - c // 2, 1, s))
            return g.concat([a, b], axis=1)
    raise AssertionError(kind)


@st.composite
def random_graphs(draw):
    c = draw(st.sampled_from([8, 16, 48, 64]))
    s = draw(st.sampled_from([32, 40, 64, 96]))
    n_in = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    g = Graph("rand")
    pool = [g.input(f"x{i}", (1, c, 1, s)) for i in range(n_in)]
    for _ in range(draw(st.integers(1, 7))):
        pool.append(_apply(g, draw, pool, rng, c, s))
    n_out = draw(st.integers(1, 2))
    for i, v in enumerate(pool[-n_out:]):
        g.output(f"y{i}", v)
    if draw(st.booleans()):
        g.output("first", pool[n_in] if len(pool) > n_in else pool[0])
    return g, rng


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_match_the_reference(case):
    g, rng = case
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs}
    want = evaluate(g, feeds)
    with compile_graph(g, backend="vane") as model:
        got = model.run(feeds)
    for k in want:
        scale = max(1.0, float(np.abs(want[k]).max()))
        np.testing.assert_allclose(got[k], want[k], rtol=2e-2, atol=1e-2 * scale,
                                   err_msg=f"output {k} of\n{dump_graph(g)}")


def _chain(n_layers, c=64, s=384):
    rng = np.random.default_rng(0)
    g = Graph("chain")
    x = g.input("x", (1, c, 1, s))
    h = x
    for i in range(n_layers):
        h = g.add(h, g.tanh(composites.linear(g, composites.rms_norm(g, h, np.ones(c)),
                                              rng.standard_normal((c, c)) / 8, None,
                                              name=f"l{i}")))
    g.output("y", h)
    return g


def test_programs_chain_through_shared_surfaces():
    g = _chain(4)
    xv = np.random.default_rng(1).standard_normal((1, 64, 1, 384)).astype(np.float32)
    with compile_graph(g, DeviceLimits(max_weight_bytes=2 * 64 * 64 + 1000),
                       backend="vane") as model:
        assert len(model.programs) == 4
        for _ in range(2):   # surfaces are bound once and reused
            got = model.run({"x": xv})["y"]
            np.testing.assert_allclose(got, evaluate(g, {"x": xv})["y"], rtol=2e-2, atol=2e-2)
        assert model.chain_stats.shared == 3 and model.chain_stats.copied == 0
        assert model.chain_stats.fed == 1


def test_outputs_into_caller_arrays():
    """run(out=...) fills the caller's arrays (no fresh pages per call) with the same
    values, and refuses an array of the wrong shape."""
    g = _chain(2)
    xv = np.random.default_rng(2).standard_normal((1, 64, 1, 384)).astype(np.float32)
    with compile_graph(g, backend="vane") as model:
        want = model.run({"x": xv})["y"]
        buf = np.full(want.shape, np.nan, np.float32)
        got = model.run({"x": xv}, out={"y": buf})["y"]
        assert got is buf
        np.testing.assert_array_equal(buf, want)
        with pytest.raises(ValueError, match="shape"):
            model.run({"x": xv}, out={"y": np.empty((1, 64, 1, 383), np.float32)})


def _scaled(c=64, s=384):
    g = Graph("scaled")
    x, a = g.input("x", (1, c, 1, s)), g.input("a", (c, s))
    g.output("y", g.tanh(g.mul(x, g.reshape(a, (1, c, 1, s)))))
    return g


def test_staged_inputs_are_bound_from_their_own_surfaces():
    """stage() writes inputs once (e.g. one layer's weights) for many runs: a run with
    them staged equals one that feeds them, write() restages them, and the staged
    values are a copy (changing the caller's array later changes nothing)."""
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((1, 64, 1, 384)).astype(np.float32)
    a1, a2 = (rng.standard_normal((64, 384)).astype(np.float16) for _ in range(2))
    with compile_graph(_scaled(), backend="vane") as model:
        staged = model.stage({"a": a1})
        try:
            fed = model.run({"x": xv, "a": a1})["y"]
            np.testing.assert_array_equal(model.run({"x": xv}, staged=staged)["y"], fed)
            a1[...] = 0
            np.testing.assert_array_equal(model.run({"x": xv}, staged=staged)["y"], fed)
            staged.write({"a": a2})
            np.testing.assert_array_equal(model.run({"x": xv}, staged=staged)["y"],
                                          model.run({"x": xv, "a": a2})["y"])
            with pytest.raises(ValueError, match="staged"):
                model.run({"x": xv, "a": a2}, staged=staged)     # given twice
            with pytest.raises(ValueError, match="inputs are"):
                model.run({}, staged=staged)                     # x missing
            with pytest.raises(ValueError, match="staged inputs are"):
                staged.write({"x": xv})
            with pytest.raises(ValueError, match="not inputs"):
                model.stage({"b": a2})
            with compile_graph(_scaled(c=32), backend="vane") as other:
                with pytest.raises(ValueError, match="another graph"):
                    other.run({"x": xv}, staged=staged)
        finally:
            staged.release()


@pytest.mark.parametrize("skipped, b_shape", [
    ("layout_channel_first", (1, 8, 8, 384)),   # rank 4 but not [1, C, 1, S]
    ("pad_io_surfaces", (1, 8, 1, 40)),         # 640 bytes, width 40
    ("order_io_by_name", (1, 64, 1, 384)),      # names a, a_b
])
def test_vane_rejects_what_a_skipped_pass_would_fix(skipped, b_shape):
    """vane's verifier enforces the same constraints that the passes fix."""
    g = Graph("t")
    a = g.input("a", (1, 64, 1, 384))
    b = g.input("a_b", b_shape)   # "a" is a prefix of it
    g.output("y", g.add(a, g.reduce_mean(b, (1, 2, 3), keep_dims=True)))
    p = program_from_graph(legalize_graph(g), f"skip_{skipped}")
    ps = next(ps for ps in PROGRAM_PASSES if ps.name == skipped)
    for q in PROGRAM_PASSES:
        if q is not ps and not (q.name == "pad_io_surfaces" and skipped == "layout_channel_first"):
            p = q.run(p)
    before = ps.check(p)
    assert before
    em = emit(p)
    with pytest.raises(ConstraintError) as e:
        Program.compile(em.mil, em.weights, backend="vane").release()
    assert any(v.constraint in str(e.value) for v in before), (str(e.value), before)
    fixed = emit(ps.run(p) if skipped != "layout_channel_first"
                 else next(q for q in PROGRAM_PASSES if q.name == "pad_io_surfaces").run(ps.run(p)))
    Program.compile(fixed.mil, fixed.weights, backend="vane").release()


def test_lowered_programs_pass_the_verifier_and_report_binding_order():
    low = lower_graph(_chain(2))
    for em in low.emitted:
        with Program.compile(em.mil, em.weights, backend="vane") as p:
            assert [io.name for io in p.inputs] == [s.name for s in em.inputs]
            assert [io.shape for io in p.outputs] == [s.device_shape for s in em.outputs]


def test_a_weight_file_written_to_disk_is_the_blob_in_memory(tmp_path):
    """`weights_folder` writes the weight file straight from the graph's arrays (a build
    then holds its weights once): the same bytes and offsets as the blob in memory, and
    a program compiled from the file (mapped, not read) computes the same."""
    rng = np.random.default_rng(3)
    g = Graph("disk")
    x = g.input("x", (1, 64, 1, 32))
    w = rng.standard_normal((96, 64, 1, 1)).astype(np.float16)
    y = g.conv1x1(x, g.const(w, name="w"))
    g.output("y", g.add(y, g.const(rng.standard_normal((1, 96, 1, 1)).astype(np.float16),
                                   name="b")))
    in_memory = lower_graph(g, share_weights=True).emitted[0]
    on_disk = lower_graph(g, share_weights=True, weights_folder=tmp_path).emitted[0]
    assert on_disk.mil == in_memory.mil and on_disk.weight_offsets == in_memory.weight_offsets
    [(key, path)] = on_disk.weights.items()
    assert path.parent == tmp_path and path.read_bytes() == bytes(in_memory.weights[key])
    # the legalized program's own input surface: the same feed to both programs
    x_in = rng.standard_normal(in_memory.inputs[0].device_shape).astype(np.float16)
    outs = []
    for em in (in_memory, on_disk):
        with Program.compile(em.mil, em.weights, backend="vane") as p:
            outs.append(list(p.run({em.inputs[0].name: x_in}).values())[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.abs(outs[0]).max() > 0
