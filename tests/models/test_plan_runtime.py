"""The runtime on its plan: layers grouped into programs give the logits of one layer a
program bit for bit (GPT-2, a 2-layer Qwen3, with and without LoRA), a decode token
costs the plan's evals, compiles follow the plan's count, LoRA ranks padded to their
bucket change no bit and share programs, and a plan over the budget fails before
anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from models.conftest import TINY, save_peaked_gpt2
from models.hf_fixtures import PUBLISHED, SHRINK, save_numpy_init
from orion.errors import PlanError
from orion.formats.peft import LoraConfig
from orion.models import load_model
from orion.models.adapters import Adapter
from orion.runtime import compile_budget, compile_count, set_compile_budget

IDS = [int(i) for i in np.random.default_rng(0).integers(0, 1000, 36)]
BUCKETS = {"prefill_buckets": (32,), "decode_buckets": (32, 64)}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """Qwen3-0.6B's published config, shrunk to 2 layers (hf_fixtures.SHRINK) and a
    vocabulary of 4096 (the head's 151,936 rows would be most of the test's time)."""
    config = dict(PUBLISHED["Qwen3-0.6B"], **SHRINK["Qwen3-0.6B"], vocab_size=4096)
    return save_numpy_init(tmp_path_factory.mktemp("qwen3") / "q", config)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """The tiny GPT-2 of tests/models/conftest.py with a vocabulary of 2048."""
    return save_peaked_gpt2(tmp_path_factory.mktemp("gpt2") / "g", dict(TINY, vocab_size=2048))


def adapter(arch, rank: int, seed: int) -> Adapter:
    rng = np.random.default_rng(seed)
    ad = Adapter(LoraConfig(r=rank, alpha=2.0 * rank,
                            targets=("q_proj", "v_proj", "down_proj")), arch)
    for layer, module in ad.keys():
        out, inp = arch.module_shape(module, layer)
        ad.matrices[layer, module] = (rng.normal(0, 0.1, (rank, inp)).astype(np.float32),
                                      rng.normal(0, 0.1, (out, rank)).astype(np.float32))
    return ad


def session(folder, rank: int | None = None, **options) -> tuple[list[np.ndarray], object]:
    """Last-row and all-row prefill logits, then 40 decode steps across both cache
    buckets; and the model's stats."""
    m = load_model(folder, **BUCKETS, **options)
    try:
        if rank is not None:
            m.adapters.add(adapter(m.arch, rank, rank), "a")
            m.set_adapter("a")
        out = [m.prefill(IDS[:20]), m.prefill(IDS[:20], all_logits=True)]
        out += [m.decode(t) for t in IDS]
        if rank is None:
            assert m.stats.decode_evals == m.plan.decode_evals * len(IDS)
        return out, m
    finally:
        m.close()


@pytest.mark.slow
@pytest.mark.parametrize("which,rank", [("gpt2", None), ("qwen3", None), ("qwen3", 8)])
def test_grouped_layers_give_the_per_layer_logits_bit_for_bit(which, rank, request):
    folder = request.getfixturevalue(f"{which}_dir")
    per_layer, one = session(folder, rank, program_weight_bytes=0)
    grouped, many = session(folder, rank)
    assert len(one.plan.groups) == 2 and len(many.plan.groups) == 1
    assert (one.plan.decode_evals, many.plan.decode_evals) == (3, 2)
    for a, b in zip(per_layer, grouped, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_lora_inputs_over_the_io_bound_split_the_programs_and_keep_the_bits(qwen3_dir,
                                                                           monkeypatch):
    """Fewer inputs a program (12): the base decode program keeps both layers, the LoRA
    one takes a layer each (3 evals a token), with the logits of both layers at once."""
    whole, _ = session(qwen3_dir, 8)
    monkeypatch.setattr("orion.models.plan.MAX_PROGRAM_IO", 12)
    split, m = session(qwen3_dir, 8)
    assert len(m.plan.groups) == 1 and m.stats.decode_evals == 3 * len(IDS)
    for a, b in zip(whole, split, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_lora_rank_padding_changes_no_bit_and_shares_the_programs(qwen3_dir):
    """Ranks 4, 8, 16 and 32 on the same modules: one bucket (32), so the first
    adapter compiles its programs and switching among the four compiles nothing; each
    gives the logits of programs compiled for its own rank exactly."""
    exact = {r: session(qwen3_dir, r, lora_rank_buckets=())[0] for r in (4, 16)}
    m = load_model(qwen3_dir, **BUCKETS)
    try:
        for r in (4, 8, 16, 32):
            m.adapters.add(adapter(m.arch, r, r), f"r{r}")
        m.set_adapter("r4")
        m.prefill(IDS[:20])
        for t in IDS:
            m.decode(t)
        compiled = compile_count()
        for r in (8, 16, 32, 4, 16):
            m.set_adapter(f"r{r}")
            logits = [m.prefill(IDS[:20]), m.prefill(IDS[:20], all_logits=True)]
            logits += [m.decode(t) for t in IDS]
            if r in exact:
                for a, b in zip(exact[r], logits, strict=True):
                    np.testing.assert_array_equal(a, b)
        assert compile_count() == compiled
    finally:
        m.close()


@pytest.mark.slow
def test_compiles_are_the_plans_count(qwen3_dir):
    """Two prefill buckets, three cache buckets, the base and two adapter signatures:
    what compile_count spends is what the plan counted at load."""
    m = load_model(qwen3_dir, prefill_buckets=(32, 64), decode_buckets=(32, 64, 128))
    try:
        before = compile_count()
        assert m.compiles_needed == len(m.plan.programs()) == 1 + 2 + 3
        m.adapters.add(adapter(m.arch, 4, 1), "small")
        big = Adapter(LoraConfig(r=48, targets=("q_proj",)), m.arch,
                      {k: v for k, v in adapter(m.arch, 48, 2).matrices.items()
                       if k[1] == "self_attn.q_proj"})
        m.adapters.add(big, "big")
        sigs = set()
        for name in (None, "small", "big"):
            m.set_adapter(name)
            sigs.add(m.plan.lora_signature(m.adapters.selected))
            for n in (40, 10):                       # both prefill buckets
                m.prefill(IDS[:n])
            for t in range(128 - 10):                # decode through the 3 cache buckets
                m.decode(t)
        expected = {k for sig in sigs for k in m.plan.programs(sig)}
        assert compile_count() - before == len(expected) == 1 + 3 * 5
        assert m.stats.programs_compiled == len(expected)
    finally:
        m.close()


def test_a_plan_over_the_budget_fails_at_load_and_an_adapter_at_selection(qwen3_dir):
    old = compile_budget()
    try:
        set_compile_budget(compile_count() + 3)
        with pytest.raises(PlanError, match=r"needs 4 more compiles .* 3 of its compile "
                                            r"budget left \(ANE-C31\)") as exc:
            load_model(qwen3_dir, **BUCKETS)
        assert "fewer buckets (prefill_buckets=[32], decode_buckets=[32, 64] now)" in \
            str(exc.value)
        set_compile_budget(compile_count() + 6)
        m = load_model(qwen3_dir, **BUCKETS)
        try:
            assert m.compiles_needed == 4
            m.adapters.add(adapter(m.arch, 4, 1), "a")
            with pytest.raises(PlanError, match="adapter 'a' for LoRA signature"):
                m.set_adapter("a")
            assert m.active_adapter is None      # refused before anything ran with it
            m.prefill(IDS[:5])
        finally:
            m.close()
    finally:
        set_compile_budget(old)
