"""A GPT-2 small transformer block (d=768, 12 heads, MLP 3072) built with the IR compiles
to programs vane accepts and matches an independent numpy reference of the block."""

import numpy as np
import pytest

from orion.ir.compile import compile_lowered, lower_graph
from orion.ir.legalize import check_program
from orion.ir.reference import evaluate

from .blocks import gpt2_block_reference, gpt2_stack

pytestmark = pytest.mark.native
D, HIDDEN, HEADS, SEQ = 768, 3072, 12, 128


@pytest.fixture(scope="module")
def block():
    return gpt2_stack(1, D, HIDDEN, HEADS, SEQ, seed=7)


@pytest.mark.slow
def test_gpt2_block_matches_numpy_on_vane(block):
    g, (w,) = block
    lowered = lower_graph(g)
    assert len(lowered.emitted) == 1    # 14 MB of weights: one program
    assert all(check_program(p) == [] for p in lowered.plan.programs)
    x = np.random.default_rng(8).standard_normal((1, D, 1, SEQ)).astype(np.float32)
    want = gpt2_block_reference(x, w, HEADS)
    np.testing.assert_allclose(evaluate(g, {"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    with compile_lowered(lowered, backend="vane") as model:
        got = model.run({"x": x})["y"]
    err = np.abs(got - want)
    assert err.max() < 2e-2 * max(1.0, np.abs(want).max()), err.max()
    assert err.mean() < 1e-3


def test_gpt2_block_emits_identical_text_and_blobs(block):
    g, _ = block
    g2, _ = gpt2_stack(1, D, HIDDEN, HEADS, SEQ, seed=7)   # built again from scratch
    a, b = lower_graph(g), lower_graph(g2)
    assert [e.mil for e in a.emitted] == [e.mil for e in b.emitted]
    assert [e.weights for e in a.emitted] == [e.weights for e in b.emitted]


@pytest.mark.slow
def test_two_layers_partitioned_match_numpy_on_vane():
    from orion.ir.partition import DeviceLimits

    g, ws = gpt2_stack(2, D, HIDDEN, HEADS, SEQ, seed=9)
    lowered = lower_graph(g, DeviceLimits(max_weight_bytes=10 * 2**20))   # attn | mlp
    assert len(lowered.emitted) == 4
    x = np.random.default_rng(10).standard_normal((1, D, 1, SEQ)).astype(np.float32)
    want = x
    for w in ws:
        want = gpt2_block_reference(want, w, HEADS)
    with compile_lowered(lowered, backend="vane") as model:
        got = model.run({"x": x})["y"]
        assert model.chain_stats.copied == 0
    assert np.abs(got - want).max() < 2e-2 * max(1.0, np.abs(want).max())
