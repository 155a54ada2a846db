"""A Llama block (RMSNorm, RoPE, causal attention, SwiGLU) forward and its activation
gradient, written with the IR: checked against numpy, finite differences and vane."""

import numpy as np
import pytest

from orion.ir import Graph
from orion.ir.compile import compile_graph
from orion.ir.reference import evaluate

from .blocks import LlamaWeights, llama_block, llama_block_backward, llama_block_reference

RNG = np.random.default_rng(11)


def graphs(d, hidden, heads, seq, w):
    fwd = Graph("llama_fwd")
    fwd.output("y", llama_block(fwd, fwd.input("x", (1, d, 1, seq)), w, heads))
    bwd = Graph("llama_bwd")
    bwd.output("dx", llama_block_backward(bwd, bwd.input("x", (1, d, 1, seq)),
                                          bwd.input("dy", (1, d, 1, seq)), w, heads))
    return fwd, bwd


def test_forward_and_backward_are_right_in_float64():
    d, hidden, heads, seq = 16, 32, 2, 8
    w = LlamaWeights.random(d, hidden, RNG)
    fwd, bwd = graphs(d, hidden, heads, seq, w)
    x, dy = RNG.standard_normal((2, 1, d, 1, seq))
    np.testing.assert_allclose(evaluate(fwd, {"x": x}, np.float64)["y"],
                               llama_block_reference(x, w, heads), rtol=1e-5, atol=1e-6)
    got = evaluate(bwd, {"x": x, "dy": dy}, np.float64)["dx"]
    want = np.zeros_like(x)
    eps = 1e-6
    for j in range(x.size):
        hi, lo = x.copy(), x.copy()
        hi.reshape(-1)[j] += eps
        lo.reshape(-1)[j] -= eps
        diff = llama_block_reference(hi, w, heads) - llama_block_reference(lo, w, heads)
        want.reshape(-1)[j] = (diff * dy).sum() / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.native
def test_forward_and_backward_run_on_vane():
    d, hidden, heads, seq = 128, 256, 4, 64
    w = LlamaWeights.random(d, hidden, RNG)
    fwd, bwd = graphs(d, hidden, heads, seq, w)
    x = RNG.standard_normal((1, d, 1, seq)).astype(np.float32)
    dy = (RNG.standard_normal((1, d, 1, seq)) * 0.1).astype(np.float32)
    with compile_graph(fwd, backend="vane") as model:
        y = model.run({"x": x})["y"]
    want = llama_block_reference(x, w, heads)
    assert np.abs(y - want).max() < 2e-2 * np.abs(want).max()
    with compile_graph(bwd, backend="vane") as model:
        dx = model.run({"x": x, "dy": dy})["dx"]
    ref = evaluate(bwd, {"x": x, "dy": dy})["dx"]
    assert np.abs(dx - ref).max() < 2e-2 * np.abs(ref).max()
