"""orion.ir.autodiff: each op's vector-Jacobian product against central differences in
float64 (the IR's numpy reference), taps, W^T consts, custom backward of composites,
and the ops it refuses by name."""

from __future__ import annotations

import numpy as np
import pytest

from orion.ir import composites as C
from orion.ir.autodiff import AutodiffError, Forward, Grad, backward, grad_name
from orion.ir.graph import Graph
from orion.ir.reference import evaluate

SHAPE = (1, 6, 1, 5)


def numeric_grad(g: Graph, feeds: dict[str, np.ndarray], wrt: str, dy: np.ndarray,
                 eps: float = 1e-6) -> np.ndarray:
    """d <dy, y(x)> / dx by central differences."""
    x = feeds[wrt]
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[i] += eps
        lo[i] -= eps
        y_hi = evaluate(g, {**feeds, wrt: hi}, np.float64)["y"]
        y_lo = evaluate(g, {**feeds, wrt: lo}, np.float64)["y"]
        out[i] = float(np.sum((y_hi - y_lo) * dy)) / (2 * eps)
    return out


def check(build, shapes: dict[str, tuple[int, ...]], wrt: list[str], seed: int = 0,
          positive: bool = False) -> None:
    g = Graph("f")
    ins = {n: g.input(n, s) for n, s in shapes.items()}
    g.output("y", build(g, ins))
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(s) for n, s in shapes.items()}
    if positive:
        feeds = {n: np.abs(v) + 0.5 for n, v in feeds.items()}
    y = evaluate(g, feeds, np.float64)["y"]
    dy = rng.standard_normal(y.shape)
    bwd = backward(g, wrt=wrt, seeds=["y"]).graph
    got = evaluate(bwd, {**feeds, grad_name("y"): dy}, np.float64)
    for name in wrt:
        want = numeric_grad(g, feeds, name, dy)
        np.testing.assert_allclose(got[grad_name(name)], want, rtol=1e-5, atol=1e-7,
                                   err_msg=name)


UNARY = {
    "neg": lambda g, x: g.neg(x),
    "identity": lambda g, x: g.identity(x),
    "exp": lambda g, x: g.exp(x),
    "tanh": lambda g, x: g.tanh(x),
    "sigmoid": lambda g, x: g.sigmoid(x),
    "gelu": lambda g, x: g.gelu(x),
    "silu": lambda g, x: C.silu(g, x),
    "gelu_tanh": lambda g, x: C.gelu_tanh(g, x),
    "pow3": lambda g, x: g.pow(x, 3.0),
    "softmax_last": lambda g, x: g.softmax(x, axis=-1),
    "softmax_ch": lambda g, x: g.softmax(x, axis=1),
    "reduce_sum": lambda g, x: g.reduce_sum(x, 1),
    "reduce_mean_2": lambda g, x: g.reduce_mean(x, (1, 3)),
    "reduce_sum_flat": lambda g, x: g.reduce_sum(x, 3, keep_dims=False),
    "reshape": lambda g, x: g.reshape(x, (1, 3, 2, 5)),
    "transpose": lambda g, x: g.transpose(x, (0, 3, 1, 2)),
    "pad": lambda g, x: g.pad(x, ((0, 0), (2, 1), (0, 0), (0, 3))),
    "slice": lambda g, x: g.slice(x, (0, 1, 0, 2), (1, 4, 1, 2)),
    "split": lambda g, x: g.split(x, (2, 4), axis=1)[1] * 3.0 + g.pad(
        g.split(x, (2, 4), axis=1)[0], ((0, 0), (0, 2), (0, 0), (0, 0))),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_products(name):
    check(lambda g, i: UNARY[name](g, i["x"]), {"x": SHAPE}, ["x"])


@pytest.mark.parametrize("name", ["sqrt", "rsqrt", "pow_half"])
def test_products_of_positive_inputs(name):
    build = {"sqrt": lambda g, x: g.sqrt(x), "rsqrt": lambda g, x: g.rsqrt(x),
             "pow_half": lambda g, x: g.pow(x, -0.5)}[name]
    check(lambda g, i: build(g, i["x"]), {"x": SHAPE}, ["x"], positive=True)


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("other", [SHAPE, (1, 6, 1, 1), (1, 1, 1, 5)])
def test_binary_products_with_broadcasting(op, other):
    check(lambda g, i: getattr(g, op)(i["a"], i["b"]), {"a": SHAPE, "b": other}, ["a", "b"])


@pytest.mark.parametrize("tx", [False, True])
@pytest.mark.parametrize("ty", [False, True])
def test_matmul_products(tx, ty):
    a = (1, 2, 4, 3) if tx else (1, 2, 3, 4)
    b = (1, 2, 5, 4) if ty else (1, 2, 4, 5)
    check(lambda g, i: g.matmul(i["a"], i["b"], transpose_x=tx, transpose_y=ty),
          {"a": a, "b": b}, ["a", "b"])


def test_matmul_with_a_broadcast_batch():
    check(lambda g, i: g.matmul(i["a"], i["b"]), {"a": (1, 1, 3, 4), "b": (1, 2, 4, 5)},
          ["a", "b"])


def test_conv1x1_bakes_w_transposed_and_names_it():
    w = np.random.default_rng(3).standard_normal((7, 6, 1, 1))
    g = Graph("f")
    x = g.input("x", SHAPE)
    g.output("y", g.conv1x1(x, g.const(w, name="w")))
    bwd = backward(g, wrt=["x"], seeds=["y"])
    (t_name, source), = bwd.transposed.items()
    assert source == "w"
    t_const = next(n for n in bwd.graph.nodes if n.name == t_name)
    np.testing.assert_array_equal(t_const.attrs["value"],
                                  np.transpose(w, (1, 0, 2, 3)).astype(np.float32))
    check(lambda g, i: g.conv1x1(i["x"], g.const(w, name="w")), {"x": SHAPE}, ["x"])


def test_taps_give_forward_values_and_gradients():
    g = Graph("f")
    x = g.input("x", SHAPE)
    h = g.tanh(x, name="h")
    g.output("y", g.mul(h, 2.0))
    bwd = backward(g, wrt=["x"], seeds=["y"], taps={"h": Forward(h), "dh": Grad(h)}).graph
    x0 = np.random.default_rng(0).standard_normal(SHAPE)
    dy = np.ones(SHAPE)
    out = evaluate(bwd, {"x": x0, "grad_y": dy}, np.float64)
    np.testing.assert_allclose(out["h"], np.tanh(x0))
    np.testing.assert_allclose(out["dh"], 2.0 * dy)


def test_a_composite_uses_its_own_backward():
    """A custom VJP replaces the composite's ops: the rule's gradient is what comes out,
    and the ops inside (a reduce_max here, which has no product) are never reached."""
    g = Graph("f")
    x = g.input("x", SHAPE)
    inner = g.reduce_max(x, 1)
    y = g.mul(x, 3.0)
    y = g.add(y, g.mul(inner, 0.0))
    g.custom_vjp(y, (x,), lambda gb, ins, d: [gb.mul(d, 3.0)])
    g.output("y", y)
    bwd = backward(g, wrt=["x"], seeds=["y"]).graph
    out = evaluate(bwd, {"x": np.ones(SHAPE), "grad_y": np.ones(SHAPE)}, np.float64)
    np.testing.assert_allclose(out["grad_x"], 3.0)


def test_block_norms_match_their_numeric_gradients():
    """The Train block's RMSNorm and LayerNorm (max-scaled, with the fp16-safe backward
    of orion.ir.grads) against central differences."""
    from orion.models.architectures import gpt2
    from orion.models.blocks import Train, Weights
    from orion.models.weights import ArrayWeights

    arch = gpt2.Model(gpt2.Args(dim=6, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=3,
                                vocab_size=10, hidden_dim=8, max_positions=16, norm_eps=1e-5,
                                tie_embeddings=True))
    rng = np.random.default_rng(5)
    source = {"transformer.h.0.ln_1.weight": 1 + 0.2 * rng.standard_normal(6),
              "transformer.h.0.ln_1.bias": 0.2 * rng.standard_normal(6)}

    def build(g, i):
        b = Train(g, arch, 0, Weights(ArrayWeights(source)))
        ln = b.layer_norm(i["x"], "ln_1.weight", "ln_1.bias")
        return b.rms_norm(ln, "ln_1.weight", plus_one=True)

    check(build, {"x": SHAPE}, ["x"])


@pytest.mark.parametrize("build, what", [
    (lambda g, x: g.relu(x), "relu"),
    (lambda g, x: g.reduce_max(x, 1), "reduce_max"),
    (lambda g, x: g.pow(x, x), "pow"),
])
def test_ops_with_no_product_are_refused_by_name(build, what):
    g = Graph("f")
    x = g.input("x", SHAPE)
    g.output("y", build(g, x))
    with pytest.raises(AutodiffError, match=what):
        backward(g, wrt=["x"], seeds=["y"])


def test_an_unknown_seed_is_refused():
    g = Graph("f")
    g.output("y", g.tanh(g.input("x", SHAPE)))
    with pytest.raises(AutodiffError, match="no output 'z'"):
        backward(g, wrt=["x"], seeds=["z"])
