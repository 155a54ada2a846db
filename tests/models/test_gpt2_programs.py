"""orion.models.gpt2_programs: the device layout the KV-cache design relies on, and a
layer norm that stays finite in fp16 for GPT-2's large residual channels."""

from __future__ import annotations

import numpy as np
import pytest

from models.gpt2_reference import layer_norm as ln_reference
from orion.ir.graph import Graph
from orion.models import gpt2_programs as P
from orion.models.gpt2_weights import GPT2Config, GPT2Layer

D = 256
CONFIG = GPT2Config(n_embd=D, n_head=4, n_layer=1, n_positions=1024)


def layer(seed: int = 0) -> GPT2Layer:
    r = np.random.default_rng(seed)
    shapes = [(D,), (D,), (3 * D, D), (3 * D,), (D, D), (D,), (D,), (D,), (4 * D, D), (4 * D,),
              (D, 4 * D), (D,)]
    return GPT2Layer(*[r.normal(0, 0.02, s).astype(np.float32) for s in shapes])


@pytest.mark.parametrize("cache", [32, 256, 1024])
def test_decode_cache_rows_are_packed_at_every_bucket(cache):
    """One set of cache surfaces serves every bucket: row t of the cache sits at byte
    2 * D * t in the device tensor of every decode program."""
    em = P.lower(P.decode_layer_graph(CONFIG, layer(), f"dec{cache}", cache))
    by_source = {s.source: s for s in em.inputs}
    for name in ("k_cache", "v_cache"):
        spec = by_source[name]
        assert spec.device_shape[3] == D and spec.block == (cache, D)
    sizes = {s.device_nbytes for s in em.inputs}
    assert len(sizes) == 1 and sizes.pop() >= 49152                   # ANE-C18, C23
    assert all(s.device_shape[3] % 32 == 0 for s in em.inputs + em.outputs)   # ANE-C22
    assert [s.source for s in em.inputs] == ["x", "k_cache", "v_cache", "mask"]
    assert [s.source for s in em.outputs] == ["h", "k_new", "v_new"]
    assert [s.name for s in em.inputs] == sorted(s.name for s in em.inputs)   # ANE-C20


def test_prefill_output_surfaces_chain_into_the_next_layer():
    em = P.lower(P.prefill_layer_graph(CONFIG, layer(), "pre", 32))
    (x,) = em.inputs
    h = next(s for s in em.outputs if s.source == "h")
    assert (x.device_shape, x.block) == (h.device_shape, h.block)


def test_row_head_folds_the_vocabulary_under_the_width_limit():
    w = np.zeros((50257, D), np.float32)
    em = P.lower(P.head_graph(CONFIG, np.ones(D), np.zeros(D), w.__getitem__, "head", 1))
    (out,) = em.outputs
    assert out.device_shape == (1, P.row_vocab(50257) // 32, 1, 32)      # W <= 16384: C09


@pytest.mark.native
@pytest.mark.parametrize("scale", [0.02, 1.0, 3000.0])
def test_layer_norm_is_accurate_from_tiny_to_huge_inputs(scale):
    """The textbook form squares x - mean, which is inf in fp16 beyond 255; GPT-2's
    residual stream has channels in the thousands."""
    from orion.ir.compile import compile_graph

    r = np.random.default_rng(1)
    x = r.normal(0, scale, (1, D, 1, 32)).astype(np.float32)
    x[0, 7] = scale * 8          # one outlier channel, as in GPT-2
    gamma, beta = r.normal(1, 0.1, D), r.normal(0, 0.1, D)
    g = Graph("ln_test")
    g.output("y", P.layer_norm(g, g.input("x", x.shape), gamma, beta, 1e-5, "ln"))
    with compile_graph(g) as cg:
        y = cg.run({"x": x.astype(np.float16).astype(np.float32)})["y"]
    ref = ln_reference(x[0, :, 0, :].T.astype(np.float16).astype(np.float64), gamma, beta,
                       1e-5).T
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y[0, :, 0, :], ref, atol=0.03, rtol=0)
