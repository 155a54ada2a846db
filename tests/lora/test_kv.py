"""LoRA inside the KV-cache programs: the packed inputs give back s B A (k/v not
expanded), and prefill plus decode steps equal PEFT's logits for Llama-, Qwen2- (q/k/v
biases) and Qwen3-shaped (q/k norms, q_dim != dim) models, a feed-forward width
that does not fill whole surface rows and a hidden width that does not, with adapters
swapped between sequences by surface writes alone."""

from __future__ import annotations

import numpy as np
import pytest
from models.hf_fixtures import save_hf_model, shrunk

import orion
from lora.conftest import MODULES, peft_adapter, peft_logits
from orion.errors import LoraError, StateError
from orion.formats.peft import LoraConfig
from orion.models import load_model
from orion.models.adapters import KvLora, init_adapter, signature
from orion.models.registry import architecture_from_config
from orion.runtime import Program, compile_count

TOL = 2e-2   # fp16 activations through the layers; logits are O(1)
ARCH = architecture_from_config(
    {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 16,
     "intermediate_size": 96, "max_position_embeddings": 64}, "test")
PATHS = ARCH.linear_modules()
load_llama = load_model


def _unfold(kl: KvLora, chunks: list[np.ndarray], module: str, which: str) -> np.ndarray:
    """The matrix from its slots (its rank pieces, in rank order)."""
    parts = []
    for s in kl.slots(ARCH):
        if (s.module, s.which) == (module, which):
            rows = chunks[s.chunk][s.row: s.row + s.rows].astype(np.float32)
            parts.append(rows.reshape(s.rank, s.fold * kl.width)[:, : s.size])
    return np.concatenate(parts)


@pytest.mark.parametrize("width, capacity", [(32, 512), (64, 40), (96, 24), (32, 8)])
def test_packed_inputs_give_the_adapters_delta(width, capacity):
    cfg = LoraConfig(r=4, alpha=8, targets=tuple(MODULES),
                     rank_pattern={"model.layers.1.mlp.down_proj": 2})
    ad = init_adapter(cfg, ARCH, seed=0)
    rng = np.random.default_rng(0)
    for _a, b in ad.matrices.values():
        b[...] = rng.standard_normal(b.shape)
    kl = KvLora(signature(ad), width, capacity)
    rows = kl.chunk_rows(ARCH)
    assert max(rows) <= capacity and (len(rows) > 1) == (capacity < 100)
    for layer in range(ARCH.args.n_layers):
        chunks = kl.pack(ad, layer)
        assert [c.shape for c in chunks] == [(r, width) for r in rows]
        for module in PATHS:
            a, bt = _unfold(kl, chunks, module, "a"), _unfold(kl, chunks, module, "b")
            np.testing.assert_allclose(bt.T @ a, ad.delta(layer, module), atol=3e-3)


def test_a_matrix_over_the_surface_rows_is_cut_into_rank_pieces():
    slots = [s for s in KvLora((("mlp.down_proj", 8),), 32, 16).slots(ARCH) if s.which == "a"]
    assert [(s.first, s.rank, s.chunk) for s in slots] == [(0, 5, 0), (5, 3, 2)]
    with pytest.raises(LoraError, match="down_proj needs 3 surface rows of 32 for one rank"):
        KvLora((("mlp.down_proj", 8),), 32, 2).slots(ARCH)


def test_rank_pieces_in_the_programs_equal_peft(llama_dir, tmp_path, monkeypatch):
    """Inputs of a few rows cut every module into rank pieces: the same logits (rank 4
    as it is: padded to 32, a layer's pieces would pass the inputs a program takes)."""
    from orion.models.runtime import TransformerLM

    ad = peft_adapter(llama_dir, tmp_path / "ad", seed=4)
    ids = [int(i) for i in np.random.default_rng(4).integers(0, 2048, 24)]
    ref = peft_logits(llama_dir, ad, ids)[19:-1]
    real = TransformerLM._kv_lora
    monkeypatch.setattr(TransformerLM, "_kv_lora", lambda self, key: (
        None if (kl := real(self, key)) is None else KvLora(kl.ranks, kl.width, 4)))
    model = load_llama(llama_dir, prefill_buckets=(32,), decode_buckets=(64,),
                       lora_rank_buckets=())
    try:
        model.load_adapter(ad)
        model.set_adapter("default")
        kl = model._kv_lora(model._prefill_keys(32, model._signature())[0])
        assert len({s.first for s in kl.slots(model.arch)}) > 1   # pieces, indeed
        got = _prompt_and_steps(model, ids, 20)
    finally:
        model.close()
    assert np.abs(got - ref).max() < TOL


def _prompt_and_steps(model, ids, n_prompt):
    """Logits after the prompt, then after each further token fed by decode."""
    out = [model.prefill(ids[:n_prompt])]
    out += [model.decode(t) for t in ids[n_prompt:-1]]
    return np.stack(out)


def _check_family(folder, adapters, ids, n_prompt):
    ref = {name: peft_logits(folder, ad, ids)[n_prompt - 1: -1]
           for name, ad in (*adapters.items(), (None, None))}
    for name in adapters:
        assert np.abs(ref[name] - ref[None]).max() > 20 * TOL   # the adapter matters
    model = load_llama(folder, prefill_buckets=(32,), decode_buckets=(64,))
    for name, ad in adapters.items():
        model.load_adapter(ad, name)
    order = [*adapters, None]
    for name in order:                 # compile each signature once
        model.set_adapter(name)
        _prompt_and_steps(model, ids, n_prompt)
    for name in order:   # a build unloads every program (peak RSS): each loads here once
        model.set_adapter(name)
        _prompt_and_steps(model, ids, n_prompt)
    compiled = compile_count()
    reloads: list[str] = []
    original = {m: getattr(Program, m) for m in ("load", "unload", "update_weights")}
    for m, fn in original.items():
        setattr(Program, m, lambda self, *a, _m=m, _o=fn, **k: (reloads.append(_m),
                                                                 _o(self, *a, **k))[1])
    try:
        for name in [*reversed(order), *order]:
            model.set_adapter(name)
            got = _prompt_and_steps(model, ids, n_prompt)
            err = np.abs(got - ref[name]).max()
            assert err < TOL, (name, err)
    finally:
        for m, fn in original.items():
            setattr(Program, m, fn)
    assert compile_count() == compiled and reloads == []
    model.close()


@pytest.mark.slow
def test_llama_prefill_and_decode_equal_peft_swapping_without_compiling(llama_dir, tmp_path):
    one = peft_adapter(llama_dir, tmp_path / "one", seed=1)
    two = peft_adapter(llama_dir, tmp_path / "two", seed=2, r=8, alpha=4.0,
                       targets=("q_proj", "v_proj", "down_proj"),
                       rank_pattern={"down_proj": 2}, use_rslora=True)
    three = peft_adapter(llama_dir, tmp_path / "three", seed=3)   # one's signature
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 2048, 40)]
    _check_family(llama_dir, {"one": one, "two": two, "three": three}, ids, 24)


# a feed-forward width (80) that is not a multiple of the surface rows (32): the packed
# matrices end in a cut row
ODD_FFN = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 80, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 1, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": False}


# Qwen3-4B's shape shrunk by 8: D = 320 is not a multiple of KVD = 128, so the decode
# surfaces are rows of 128 and a hidden row folds into 3 of them, zero-padded
PADDED_ROWS = {**shrunk("Qwen3-0.6B"), "hidden_size": 320, "num_attention_heads": 4,
               "num_key_value_heads": 1}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["Qwen2.5-0.5B", "Qwen3-0.6B", "odd-ffn", "padded-rows"])
def test_qwen_and_odd_shapes_equal_peft(family, tmp_path):
    base = {"odd-ffn": ODD_FFN, "padded-rows": PADDED_ROWS}.get(family) or shrunk(family)
    config = {**base, "num_hidden_layers": 1, "vocab_size": 512, "bos_token_id": 0,
              "eos_token_id": 0}
    folder = save_hf_model(tmp_path / "base", config, seed=0)
    ad = peft_adapter(folder, tmp_path / "ad", seed=1, r=4)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 512, 28)]
    _check_family(folder, {"ad": ad}, ids, 20)


@pytest.mark.slow
def test_decode_after_switching_adapter_needs_a_prefill(llama_dir, tmp_path):
    ad = peft_adapter(llama_dir, tmp_path / "ad", seed=1, targets=("q_proj",))
    model, _ = orion.load(llama_dir, prefill_buckets=(32,), decode_buckets=(64,))
    model.load_adapter(ad, "ad")
    model.prefill([1, 2, 3])
    model.set_adapter("ad")
    assert model.position == 0          # the cache holds the base model's keys
    with pytest.raises(StateError, match="prefill again"):
        model.decode(4)
    model.set_adapter(None)
    assert model.position == 3
    model.decode(4)
    model.close()


@pytest.mark.slow
def test_a_decode_after_another_adapters_prefill_reads_its_own_adapter(llama_dir, tmp_path):
    """Two adapters of one signature share the programs: a decode token after the other
    adapter's prefill and a reset runs on its own adapter's inputs, not on what the
    last decode sequence of that bucket read."""
    one = peft_adapter(llama_dir, tmp_path / "one", seed=1)
    three = peft_adapter(llama_dir, tmp_path / "three", seed=3)
    ids = [int(i) for i in np.random.default_rng(2).integers(0, 2048, 12)]
    model = load_llama(llama_dir, prefill_buckets=(32,), decode_buckets=(64,))
    model.load_adapter(one, "one")
    model.load_adapter(three, "three")
    model.set_adapter("one")
    model.prefill(ids[:8])
    for t in ids[8:11]:             # the bucket's sequence, then it again
        model.decode(t)
    model.set_adapter("three")
    model.prefill(ids[:8])
    model.set_adapter("one")
    model.reset()
    got = model.decode(ids[0])
    model.close()
    ref = peft_logits(llama_dir, one, ids[:1])[0]
    assert np.abs(got - ref).max() < TOL
