"""TransformerLM.verify (speculative decoding's check of K drafted tokens in one eval):
its rows against sequential decode steps and transformers' logits (GPT-2; a 2-layer
Qwen3 and a Mistral whose sliding window the rows cross), across a decode bucket,
the cache it leaves behind, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from models.conftest import TINY, save_peaked_gpt2
from models.hf_fixtures import PUBLISHED, SHRINK, hf_reference, save_numpy_init
from orion.errors import InvalidArgumentError, PlanError, StateError
from orion.models import load_model
from orion.models.plan import VERIFY_ROWS, verify_programs, verify_rows
from orion.runtime import compile_count, set_compile_budget

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("gpt2_compile_budget")]
BUCKETS = {"prefill_buckets": (32,), "decode_buckets": (32, 64)}
# verify rows against decode steps: the same math in another order of fp16 roundings
# (the new keys' scores as a [K, K] matmul, not decode's multiply and sum; the
# projections as K-column convs), measured at most 0.0025 (GPT-2 0.00195 = 1 ulp of
# its largest logit, 3.3; Qwen3, Mistral) and 0.011 (Gemma 3, largest logit 3.1, where
# a prefill's logits differ from decode's by 0.007): at most 6 fp16 ulps of the largest
# logit. Against transformers, GPT-2's verify rows are within 0.0010 (decode: 0.0016).
DECODE_ULPS = 8
DECODE_BOUND = 5e-3   # GPT-2: 2.5 ulps
rng = np.random.default_rng(0)
PROMPT = [int(i) for i in rng.integers(0, 2048, 28)]
ROWS = [int(i) for i in rng.integers(0, 2048, 7)]   # positions 28 .. 34: past bucket 32


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_peaked_gpt2(tmp_path_factory.mktemp("gpt2") / "g", dict(TINY, vocab_size=2048))


@pytest.fixture(scope="module")
def gpt2(gpt2_dir):
    m = load_model(gpt2_dir, **BUCKETS)
    yield m
    m.close()


def shaped(tmp_path_factory, name):
    config = {**PUBLISHED[name], "vocab_size": 4096, **SHRINK[name]}
    return save_numpy_init(tmp_path_factory.mktemp(name) / "m", config)


def decode_rows(m, prompt, rows):
    m.prefill(prompt)
    return np.stack([m.decode(t) for t in rows])


def test_verify_rows_equal_decode_steps_and_transformers(gpt2, gpt2_dir):
    ref = decode_rows(gpt2, PROMPT, ROWS)
    gpt2.prefill(PROMPT)
    out = gpt2.verify(ROWS)
    assert out.shape == (7, 2048) and gpt2.position == 35
    assert np.abs(out - ref).max() <= DECODE_BOUND
    assert (out.argmax(1) == ref.argmax(1)).all()
    torch = pytest.importorskip("torch")
    hf = hf_reference(gpt2_dir)
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT + ROWS])).logits[0, len(PROMPT) - 1 + 1:].numpy()
    # the same oracle bound as decode's against transformers (fp16 through 2 layers)
    assert np.abs(out - want).max() <= np.abs(ref - want).max() + DECODE_BOUND
    assert (out.argmax(1) == want.argmax(1)).all()


def test_truncate_keeps_the_accepted_prefix(gpt2):
    gpt2.prefill(PROMPT)
    gpt2.verify(ROWS)
    gpt2.truncate(len(PROMPT) + 3)            # keep 3 of the 7 rows
    after = gpt2.decode(ROWS[3])
    ref = decode_rows(gpt2, PROMPT, ROWS[:4])[-1]
    assert np.abs(after - ref).max() <= DECODE_BOUND
    assert after.argmax() == ref.argmax()
    gpt2.truncate(len(PROMPT))                # and a verify after a truncate
    again = gpt2.verify(ROWS[:2])
    assert np.abs(again - decode_rows(gpt2, PROMPT, ROWS[:2])).max() <= DECODE_BOUND


def test_padding_rows_change_nothing(gpt2):
    gpt2.prefill(PROMPT)
    five = gpt2.verify(ROWS[:5])              # 5 rows pad to 8
    gpt2.prefill(PROMPT)
    eight = gpt2.verify(ROWS[:5] + [1, 2, 3])
    np.testing.assert_array_equal(five, eight[:5])


def test_last_only_is_the_last_rows_logits_and_the_same_cache(gpt2):
    """verify(last_only=True) runs decode's head on the last row alone: the bits of
    the full verify's last row, with the same keys and values cached after it."""
    gpt2.prefill(PROMPT)
    full = gpt2.verify(ROWS)
    after_full = gpt2.decode(3)
    gpt2.prefill(PROMPT)
    last = gpt2.verify(ROWS, last_only=True)
    assert last.shape == (2048,) and gpt2.position == len(PROMPT) + len(ROWS)
    np.testing.assert_array_equal(last, full[-1])
    np.testing.assert_array_equal(gpt2.decode(3), after_full)


def test_refuses_rows_past_the_context(gpt2):
    gpt2.prefill(PROMPT)
    for t in range(64 - len(PROMPT) - 3):
        gpt2.decode(t)
    assert gpt2.position == 61
    with pytest.raises(InvalidArgumentError, match="pass the context"):
        gpt2.verify([1, 2, 3, 4])
    assert gpt2.position == 61
    gpt2.verify([1, 2, 3])                    # exactly to the end
    assert gpt2.position == 64
    with pytest.raises(InvalidArgumentError):
        gpt2.verify([])
    with pytest.raises(PlanError, match="largest verify bucket"):
        verify_rows(VERIFY_ROWS[-1] + 1)


# Mistral's one window runs with the slow tests: Gemma 3's two cover windows here
@pytest.mark.parametrize("name", [
    "Qwen3-0.6B", pytest.param("Mistral-7B-v0.1", marks=pytest.mark.slow), "gemma-3-1b"])
def test_verify_rows_equal_decode_steps_rope_gqa_and_windows(name, tmp_path_factory):
    # Mistral's window shrinks to 24: rows at 28 .. 34 each see their own window;
    # Gemma 3's program holds local (window 16) and global layers: a mask of each
    m = load_model(shaped(tmp_path_factory, name), **BUCKETS)
    try:
        ids = [t % 4096 for t in PROMPT]
        ref = decode_rows(m, ids, ROWS)
        m.prefill(ids)
        out = m.verify(ROWS)
        ulp = 2.0 ** (np.floor(np.log2(np.abs(ref).max())) - 10)
        assert np.abs(out - ref).max() <= DECODE_ULPS * ulp
        assert (out.argmax(1) == ref.argmax(1)).all()
    finally:
        m.close()


def test_lora_is_refused(gpt2_dir):
    from orion.formats.peft import LoraConfig
    from orion.models.adapters import Adapter

    m = load_model(gpt2_dir, **BUCKETS)
    try:
        ad = Adapter(LoraConfig(r=4, alpha=8.0, targets=("c_attn",)), m.arch)
        for layer, module in ad.keys():
            out, inp = m.arch.module_shape(module, layer)
            ad.matrices[layer, module] = (np.zeros((4, inp), np.float32),
                                          np.zeros((out, 4), np.float32))
        m.adapters.add(ad, "a")
        m.set_adapter("a")
        m.prefill(PROMPT)
        with pytest.raises(StateError, match="LoRA adapter"):
            m.verify(ROWS)
    finally:
        m.close()


def test_the_compile_budget_counts_verify_programs(gpt2_dir):
    m = load_model(gpt2_dir, **BUCKETS)
    try:
        keys = verify_programs(m.plan, 8)
        assert len(keys) == len(m.plan.heads) + len(m.plan.groups) * 2
        assert {k.name("gpt2", "t") for k in keys} >= {"gpt2_t_l00_01_verify32x8"}
        need = m.plan_verify(8)
        # the verify programs and the model's own, less those compiled or stored
        assert need == sum(not m._have(k) for k in {*keys, *m.plan.programs()})
        m.prefill(PROMPT)
        m.verify(ROWS[:3])                    # positions 28 .. 30: bucket 32
        spent = compile_count()
        m.truncate(len(PROMPT))
        m.verify(ROWS[:2])                    # pads to the planned 8: no 4-row programs
        assert compile_count() == spent
        assert not any(k.rows == 4 for k in m._programs)
        set_compile_budget(compile_count() + 2)   # 16 rows: 3 programs more
        with pytest.raises(PlanError, match=r"speculative decoding needs \d+ more compiles"):
            m.plan_verify(16)
    finally:
        set_compile_budget(1_000_000)
        m.close()
