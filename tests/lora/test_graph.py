"""The LoRA inputs and term: padding to the program rank and the k/v expansion leave
s B A unchanged; modules the spec does not adapt are left alone."""

from __future__ import annotations

import numpy as np

from orion.ir.graph import Graph
from orion.lora.adapter import init_adapter
from orion.lora.config import LoraConfig
from orion.lora.graph import LoraSpec, input_names, layer_feeds, signature
from orion.models.llama_config import LlamaConfig
from orion.models.llama_programs import expand_kv

CFG = LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=16, hidden_dim=48,
                  max_seq_len=16)


def test_padded_expanded_feeds_give_the_adapters_delta():
    cfg = LoraConfig(r=4, alpha=8, targets=("k_proj", "down_proj"),
                     rank_pattern={"model.layers.1.mlp.down_proj": 2})
    ad = init_adapter(cfg, CFG, seed=0)
    rng = np.random.default_rng(0)
    for _a, b in ad.matrices.values():
        b[...] = rng.standard_normal(b.shape)
    sig = signature(ad)
    assert sig == (("k_proj", 4), ("down_proj", 4))     # program rank: the largest
    for layer in range(CFG.n_layers):
        feeds = layer_feeds(ad, sig, layer, CFG)
        for module, want in (("k_proj", expand_kv(ad.delta(layer, "k_proj"), CFG)),
                             ("down_proj", ad.delta(layer, "down_proj"))):
            a, b = (feeds[n][0, 0].astype(np.float32) for n in input_names(module))
            np.testing.assert_allclose(b @ a, want, atol=2e-3)


def test_spec_adds_inputs_only_for_its_modules():
    g = Graph("t")
    x = g.input("x", (1, 32, 1, 8))
    y = g.input("y", (1, 32, 1, 8))
    spec = LoraSpec((("q_proj", 2),))
    assert spec.apply(g, x, y, "self_attn.v_proj.weight", False) is y
    out = spec.apply(g, x, y, "self_attn.q_proj.weight", False)
    assert out is not y and {v.name for v in g.inputs} == {"x", "y", "lora_a_q_proj",
                                                            "lora_b_q_proj"}
    spec_d = LoraSpec((("q_proj", 2),), dropout=True)
    spec_d.apply(g, x, y, "self_attn.q_proj.weight", True)
    assert "lora_m_q_proj" in {v.name for v in g.inputs}
