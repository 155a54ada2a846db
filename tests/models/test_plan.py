"""orion.models.plan: what goes into which program, for the real shapes of the issue's
targets (no weights: a plan is arithmetic on the architecture), and the errors a plan
that cannot fit gives at load."""

from __future__ import annotations

import pytest

from models.conftest import SMALL
from models.hf_fixtures import PUBLISHED
from orion.errors import PlanError
from orion.models.architectures import gpt2, llama
from orion.models.plan import (
    COMPILE_BUDGET,
    MiB,
    balanced_runs,
    layer_weight_bytes,
    plan_programs,
    rank_bucket,
)
from orion.models.registry import architecture_from_config

QWEN3 = architecture_from_config(PUBLISHED["Qwen3-0.6B"], "Qwen3-0.6B")
PREFILL, DECODE = (32, 128), (256, 1024, 4096)


def _gpt2_124m() -> gpt2.Model:
    d = SMALL["n_embd"]
    return gpt2.Model(gpt2.Args(dim=d, n_layers=SMALL["n_layer"], n_heads=SMALL["n_head"],
                                n_kv_heads=SMALL["n_head"], head_dim=d // SMALL["n_head"],
                                vocab_size=SMALL["vocab_size"], hidden_dim=4 * d,
                                max_positions=SMALL["n_positions"], norm_eps=1e-5,
                                tie_embeddings=True))


def test_qwen3_06b_session_fits_40_compiles_and_4_evals_a_token():
    """3 cache buckets, 2 prefill buckets, the base model and 2 adapter signatures:
    the issue's <= 40 compiles (113+ one layer a program, without any adapter)."""
    plan = plan_programs(QWEN3, PREFILL, DECODE)
    assert [(g.start, g.stop) for g in plan.groups] == [(0, 14), (14, 28)]
    assert plan.decode_evals == 3 <= 4
    sigs = [(), (("self_attn.q_proj", 32),), (("self_attn.q_proj", 32), ("mlp.down_proj", 64))]
    programs = {k for sig in sigs for k in plan.programs(sig)}
    assert len(programs) == 1 + 3 * 2 * (2 + 3) == 31 <= 40
    per_layer = plan_programs(QWEN3, PREFILL, DECODE, program_weight_bytes=0)
    assert per_layer.decode_evals == 29
    assert len(per_layer.programs()) == 1 + 28 * 5 > COMPILE_BUDGET


def test_gpt2_124m_prefill_128_and_decode_to_1024_in_8_compiles():
    plan = plan_programs(_gpt2_124m(), (128,), (256, 1024))
    assert len(plan.groups) == 1 and plan.decode_evals == 2
    assert len(plan.programs()) == 4 <= 8


def test_layers_group_evenly_within_the_bound():
    assert balanced_runs([30] * 28, 17 * 30) == [(0, 14), (14, 28)]
    assert balanced_runs([30] * 28, 10 * 30) == [(0, 10), (10, 20), (20, 28)]
    assert balanced_runs([5, 50, 5], 20) == [(0, 1), (1, 2), (2, 3)]   # over the bound: alone
    plan = plan_programs(QWEN3, PREFILL, DECODE, program_weight_bytes=300 * MiB)
    assert all(g.weight_bytes <= 300 * MiB for g in plan.groups)
    assert sum(layer_weight_bytes(QWEN3, i) for i in range(28)) == plan.layer_bytes


def test_lora_ranks_share_a_bucket_up_to_32():
    assert {rank_bucket(r, (32, 64, 128, 256)) for r in (1, 4, 8, 16, 32)} == {32}
    assert [rank_bucket(r, (32, 64, 128, 256)) for r in (33, 64, 65, 300)] == [64, 64, 128, 512]
    assert [rank_bucket(r, ()) for r in (4, 8)] == [4, 8]


def test_over_budget_names_the_numbers_and_the_option():
    plan = plan_programs(QWEN3, PREFILL, DECODE, program_weight_bytes=0)
    with pytest.raises(PlanError) as exc:
        plan.fit(COMPILE_BUDGET, lambda key: False, what="Qwen3-0.6B")
    msg = str(exc.value)
    assert "Qwen3-0.6B needs 141 more compiles" in msg and "119" in msg and "ANE-C31" in msg
    assert "28 layer program(s) x (2 prefill + 3 decode buckets) + 1 head" in msg
    # the bound that would fit: 23 layer programs at most ((119 - 1) // 5)
    assert "program_weight_bytes=" in msg and "(23 layer programs)" in msg
    bound = int(msg.split("program_weight_bytes=")[2].split(" ")[0])
    fits = plan_programs(QWEN3, PREFILL, DECODE, program_weight_bytes=bound)
    assert len(fits.programs()) <= COMPILE_BUDGET
    assert plan.fit(COMPILE_BUDGET, lambda key: key.kind != "head" and key.layer < 25) == 16
    two = plan_programs(QWEN3, PREFILL, DECODE)
    sig = (("self_attn.q_proj", 32),)
    assert two.fit(COMPILE_BUDGET, lambda key: False, [(), sig]) == 21
    with pytest.raises(PlanError, match=r"signature \(\('self_attn.q_proj', 32\),\) needs 21"):
        two.fit(20, lambda key: False, [(), sig])


def test_a_layer_over_4_gib_is_refused_and_a_large_head_is_split():
    huge = llama.Model(llama.Args(dim=16384, n_layers=1, n_heads=128, n_kv_heads=8,
                                  head_dim=128, vocab_size=1000, hidden_dim=53248,
                                  max_positions=4096, norm_eps=1e-5, tie_embeddings=True))
    with pytest.raises(PlanError, match="ANE-C36"):
        plan_programs(huge, (32,), (256,))
    wide = llama.Model(llama.Args(dim=8192, n_layers=1, n_heads=64, n_kv_heads=8,
                                  head_dim=128, vocab_size=262144, hidden_dim=256,
                                  max_positions=4096, norm_eps=1e-5, tie_embeddings=True))
    plan = plan_programs(wide, (32,), (256,))
    assert len(plan.heads) == 8 and all(h.weight_bytes <= 512 * MiB for h in plan.heads)
    assert plan.decode_evals == 9 and not plan.decode_resident   # 4 GiB of head: ANE-C35
    assert "reload" in plan.describe()


def test_lora_inputs_past_the_io_bound_split_a_programs_layers():
    plan = plan_programs(QWEN3, PREFILL, DECODE)
    assert plan.max_layers("decode") == 126 and plan.max_layers("prefill") == 127
    assert [(g.start, g.stop) for g in plan.groups_for("prefill", 20)] == \
        [(0, 7), (7, 14), (14, 21), (21, 28)]             # 12 layers' inputs at most
    assert len(plan.groups_for("decode", 1)) == 2       # a few inputs: as planned
    keys = plan.decode_keys(256, (("mlp.down_proj", 32),), 22)
    assert [k.count for k in keys] == [7, 7, 7, 7]
    with pytest.raises(PlanError, match="300 LoRA inputs pass the 256 inputs"):
        plan.groups_for("prefill", 300)
