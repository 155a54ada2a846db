"""orion.models.programs: the device layout the KV-cache design relies on, for any
architecture, and a layer norm that stays finite in fp16 for GPT-2's large residual
channels."""

from __future__ import annotations

import numpy as np
import pytest

from models.gpt2_reference import layer_norm as ln_reference
from orion.ir import composites as C
from orion.ir.graph import Graph
from orion.models import programs as P
from orion.models.architectures import gpt2, qwen3
from orion.models.blocks import Weights
from orion.models.weights import ArrayWeights, init_weights

D = 256
GPT2 = gpt2.Model(gpt2.Args(dim=D, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=64,
                            vocab_size=50257, hidden_dim=4 * D, max_positions=1024,
                            norm_eps=1e-5, tie_embeddings=True))
QWEN3 = qwen3.Model(qwen3.Args(dim=D, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=96,
                               vocab_size=1000, hidden_dim=512, max_positions=4096,
                               norm_eps=1e-6, tie_embeddings=True))


def weights(arch) -> Weights:
    return Weights(ArrayWeights(init_weights(arch, 0)))


@pytest.mark.parametrize("cache", [32, 256, 1024])
@pytest.mark.parametrize("arch", [GPT2, QWEN3], ids=["gpt2", "qwen3"])
def test_decode_cache_rows_are_packed_at_every_bucket(arch, cache):
    """One set of cache surfaces serves every bucket: row t of the cache sits at byte
    2 * KVD * t in the device tensor of every decode program."""
    em = P.lower(P.decode_graph(arch, weights(arch), 0, f"dec{cache}", cache))
    by_source = {s.source: s for s in em.inputs}
    lay = P.RowLayout.of(arch)
    for name in ("k_cache", "v_cache"):
        spec = by_source[name]
        assert spec.device_shape[3] == lay.width
        assert spec.block == (lay.cache_rows(arch.args.kv_dim, cache), lay.width)
    sizes = {s.device_nbytes for s in em.inputs}
    assert len(sizes) == 1 and sizes.pop() >= 49152                   # ANE-C18, C23
    assert all(s.device_shape[3] % 32 == 0 for s in em.inputs + em.outputs)   # ANE-C22
    rope = ["rope"] if arch is QWEN3 else []
    assert [s.source for s in em.inputs] == ["x", "k_cache", "v_cache", "mask", *rope]
    assert [s.source for s in em.outputs] == ["h_rows", "k_row", "v_row"]
    assert [s.name for s in em.inputs] == sorted(s.name for s in em.inputs)   # ANE-C20


def test_prefill_output_surfaces_chain_into_the_next_layer():
    em = P.lower(P.prefill_graph(GPT2, weights(GPT2), 0, "pre", 32))
    (x,) = em.inputs
    h = em.outputs[0]
    assert (x.device_shape, x.block) == (h.device_shape, h.block)


def test_head_chunks_fold_the_vocabulary_under_the_width_limit():
    em = P.lower(P.head_graph(GPT2, weights(GPT2), "head"))
    assert len(em.outputs) == 2                                        # 32768 + 17489 rows
    for out, (_, rows) in zip(em.outputs, P.head_chunks(50257), strict=True):
        assert out.block == (-(-rows // 32), 32)                        # W <= 16384: C09
        assert out.device_shape == (1, 1024, 1, 32)                     # one size: C18


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
    g.output("y", C.layer_norm(g, g.input("x", x.shape), gamma, beta, 1e-5, "ln"))
    with compile_graph(g) as cg:
        y = cg.run({"x": x.astype(np.float16).astype(np.float32)})["y"]
    ref = ln_reference(x[0, :, 0, :].T.astype(np.float16).astype(np.float64), gamma, beta,
                       1e-5).T
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y[0, :, 0, :], ref, atol=0.03, rtol=0)
