"""A GPT-2 through the one runtime (orion.models.runtime) against the numpy fp32
reference (tiny model)."""

from __future__ import annotations

import numpy as np
import pytest

from models.conftest import TINY, save_peaked_gpt2
from models.gpt2_reference import forward
from orion.errors import StateError
from orion.models import load_model
from orion.models.base import CausalLM
from orion.models.runtime import TransformerLM

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("gpt2_compile_budget")]
IDS = [int(i) for i in np.random.default_rng(0).integers(0, 50257, 100)]
ATOL = 0.02   # fp16 activations against fp32, logits of magnitude ~5


def test_is_a_causal_lm(tiny_gpt2):
    assert isinstance(tiny_gpt2, CausalLM)
    assert tiny_gpt2.max_length == 128
    assert tiny_gpt2.backend == "vane"


def test_prefill_matches_reference(tiny_gpt2):
    m = tiny_gpt2
    ref = forward(m.config, m.weights, IDS[:50])
    logits = m.prefill(IDS[:50], all_logits=True)
    assert logits.shape == (50, 50257) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, ref, atol=ATOL, rtol=0)
    last = m.prefill(IDS[:50])
    np.testing.assert_allclose(last, ref[-1], atol=ATOL, rtol=0)


@pytest.mark.slow
def test_prefill_then_decode_equals_the_full_sequence(tiny_gpt2):
    """Across decode buckets 32 -> 64 -> 128, with the cache carried over."""
    m = tiny_gpt2
    full = forward(m.config, m.weights, IDS)
    m.prefill(IDS[:20])
    steps = [m.decode(t) for t in IDS[20:]]
    assert m.position == len(IDS)
    np.testing.assert_allclose(np.stack(steps), full[20:], atol=ATOL, rtol=0)


def test_decode_matches_prefill_of_the_same_tokens(tiny_gpt2):
    m = tiny_gpt2
    wide = m.prefill(IDS[:60], all_logits=True)
    m.prefill(IDS[:10])
    steps = np.stack([m.decode(t) for t in IDS[10:59]])
    np.testing.assert_allclose(steps, wide[10:59], atol=ATOL / 2, rtol=0)


@pytest.mark.slow
def test_prompt_longer_than_the_largest_prefill_bucket(tiny_gpt2):
    """The first 64 tokens as one sequence, the rest one by one."""
    m = tiny_gpt2
    last = m.prefill(IDS[:90])
    assert m.position == 90
    np.testing.assert_allclose(last, forward(m.config, m.weights, IDS[:90])[-1],
                               atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="all_logits"):
        m.prefill(IDS[:90], all_logits=True)


def test_decode_from_an_empty_cache(tiny_gpt2):
    m = tiny_gpt2
    m.reset()
    first = m.decode(IDS[0])
    np.testing.assert_allclose(first, forward(m.config, m.weights, IDS[:1])[0],
                               atol=ATOL, rtol=0)


def test_reset_forgets_the_previous_sequence(tiny_gpt2):
    m = tiny_gpt2
    m.prefill(IDS[50:90])
    for t in IDS[:5]:
        m.decode(t)
    after = m.prefill(IDS[:8])
    nxt = m.decode(IDS[8])
    ref = forward(m.config, m.weights, IDS[:9])
    np.testing.assert_allclose(after, ref[7], atol=ATOL, rtol=0)
    np.testing.assert_allclose(nxt, ref[8], atol=ATOL, rtol=0)


def test_truncate_keeps_a_prefix(tiny_gpt2):
    """After truncate(n) the cache is the first n tokens: decoding on from there gives
    the reference logits of the new sequence (for orion.models.prefix_cache)."""
    m = tiny_gpt2
    m.prefill(IDS[:12])
    for t in IDS[12:16]:
        m.decode(t)
    m.truncate(6)
    assert m.position == 6
    got = [m.decode(t) for t in IDS[40:43]]
    ref = forward(m.config, m.weights, list(IDS[:6]) + list(IDS[40:43]))
    for i, logits in enumerate(got):
        np.testing.assert_allclose(logits, ref[6 + i], atol=ATOL, rtol=0)
    with pytest.raises(ValueError):
        m.truncate(m.position + 1)


@pytest.mark.slow
def test_programs_are_compiled_once_and_reused(tiny_gpt2_dir):
    m = load_model(tiny_gpt2_dir, prefill_buckets=(32,), decode_buckets=(64,))
    try:
        m.prefill(IDS[:5])
        compiled = m.stats.programs_compiled
        layers, heads = len(m.plan.groups), len(m.plan.heads)
        assert compiled == layers + heads               # prefill programs + the row head
        m.prefill(IDS[:31])                            # same bucket, another length
        for t in IDS[:10]:
            m.decode(t)
        assert m.stats.programs_compiled == compiled + layers   # decode programs
        hits = m.stats.cache_hits
        m.decode(IDS[10])
        assert m.stats.programs_compiled == compiled + layers
        assert m.stats.cache_hits == hits + layers + heads
    finally:
        m.close()


def test_builds_run_with_the_other_programs_unloaded_and_weights_held_once(tmp_path,
                                                                          monkeypatch):
    """The decode build runs with the prefill programs unloaded (a build's temporaries
    then meet the smallest footprint); the next prefill loads them again without
    compiling; a layer's prefill and decode programs hold its weights once (each
    program's own file of small constants aside: well under 1%). Weights of its own:
    the runtime holds an equal tensor once across models, so another test's model
    would share them."""
    from orion.runtime import Program, weight_memory_bytes

    folder = save_peaked_gpt2(tmp_path, {**TINY, "vocab_size": 1024}, seed=11)
    ids = [i % 1024 for i in IDS]
    base = weight_memory_bytes()
    m = load_model(folder, prefill_buckets=(32,), decode_buckets=(64,))
    try:
        first = m.prefill(ids[:5])
        held = weight_memory_bytes() - base
        assert held > 0
        loaded_at_build: list[bool] = []
        real = Program.compile.__func__

        def watched(cls, *args, **kwargs):
            loaded_at_build.extend(p.loaded for p in m._programs.values())
            return real(cls, *args, **kwargs)

        monkeypatch.setattr(Program, "compile", classmethod(watched))
        m.decode(ids[5])
        assert loaded_at_build and not any(loaded_at_build)
        prefill = [p for k, p in m._programs.items() if k.kind == "prefill"]
        assert prefill and not any(p.loaded for p in prefill)
        assert abs(weight_memory_bytes() - base - held) < held / 100
        compiled = m.stats.programs_compiled
        np.testing.assert_array_equal(m.prefill(ids[:5]), first)
        assert all(p.loaded for p in prefill) and m.stats.programs_compiled == compiled
        assert weight_memory_bytes() - base < 1.01 * held   # not twice: files shared
    finally:
        m.close()


@pytest.mark.slow
def test_decode_reruns_its_sequence_and_reloads_a_program_unloaded_between_tokens(
        tiny_gpt2_dir, monkeypatch):
    """After a bucket's first token, decode runs the bucket's sequence again without
    looking its programs up; a program unloaded in between is loaded again first,
    and the logits are those of a model left alone, bit for bit."""
    def run(unload_at: int | None) -> tuple[np.ndarray, list[int]]:
        checked: list[int] = []
        real = TransformerLM._decode_checked
        monkeypatch.setattr(TransformerLM, "_decode_checked",
                            lambda self, cache, pos: (checked.append(pos),
                                                      real(self, cache, pos))[1])
        m = load_model(tiny_gpt2_dir, prefill_buckets=(32,), decode_buckets=(32, 64))
        try:
            m.prefill(IDS[:20])
            out = []
            for i, t in enumerate(IDS[20:40]):
                if i == unload_at:
                    m._programs[m.plan.decode_keys(32)[-1]].unload()
                out.append(m.decode(t))
            return np.stack(out), checked
        finally:
            m.close()
            monkeypatch.undo()

    left_alone, checked = run(None)
    # the first token of each bucket (32: position 20, 64: position 32)
    assert checked == [20, 32]
    reloaded, checked = run(5)
    assert checked == [20, 25, 32]
    np.testing.assert_array_equal(reloaded, left_alone)


@pytest.mark.slow
def test_a_layers_programs_hold_its_weights_once(tmp_path):
    """A layer's prefill and decode programs hold its weights once (each program's own
    file of small constants aside: well under 1%), and a program unloaded for room is
    loaded again without compiling. Weights of their own: vane holds equal tensors
    once across every live program, so another model's would already be counted."""
    from orion.runtime import weight_memory_bytes

    folder = save_peaked_gpt2(tmp_path / "own", TINY, seed=11)
    base = weight_memory_bytes()
    m = load_model(folder, prefill_buckets=(32,), decode_buckets=(64,))
    try:
        first = m.prefill(IDS[:5])
        held = weight_memory_bytes() - base
        assert held > 0
        m.decode(IDS[5])
        assert weight_memory_bytes() - base < 1.01 * held   # not twice: files shared
        prefill = [p for k, p in m._programs.items() if k.kind == "prefill"]
        for p in prefill:
            p.unload()
        compiled = m.stats.programs_compiled
        np.testing.assert_array_equal(m.prefill(IDS[:5]), first)
        assert all(p.loaded for p in prefill) and m.stats.programs_compiled == compiled
    finally:
        m.close()


@pytest.mark.slow
def test_limits(tiny_gpt2_dir):
    m = load_model(tiny_gpt2_dir, prefill_buckets=(32,), decode_buckets=(32,))
    try:
        with pytest.raises(ValueError, match="over the context of 32"):
            m.prefill(IDS[:33])
        m.prefill(IDS[:31])
        m.decode(IDS[31])
        with pytest.raises(ValueError, match="cache is full"):
            m.decode(IDS[32])
        with pytest.raises(ValueError, match="token ids"):
            m.prefill([50257])
        with pytest.raises(ValueError, match="multiples of 32"):
            load_model(tiny_gpt2_dir, prefill_buckets=(16,))
    finally:
        m.close()


def test_two_models_in_one_process(tiny_gpt2_dir, tiny_gpt2):
    other = load_model(tiny_gpt2_dir, prefill_buckets=(32,), decode_buckets=(32,))
    try:
        assert isinstance(other, TransformerLM) and other.arch.model_type == "gpt2"
        a = other.prefill(IDS[:12])
        b = tiny_gpt2.prefill(IDS[:12])
        np.testing.assert_allclose(a, b, atol=1e-3, rtol=0)
    finally:
        other.close()


@pytest.mark.slow
def test_close_releases_programs_and_surfaces(tiny_gpt2_dir, no_leaks):
    m = load_model(tiny_gpt2_dir, prefill_buckets=(32,), decode_buckets=(32,))
    m.prefill(IDS[:3])
    m.decode(IDS[3])
    m.close()
    m.close()
    with pytest.raises(StateError, match="closed"):
        m.prefill(IDS[:3])


def test_a_build_writes_its_weight_file_beside_the_program_folders(tmp_path, monkeypatch):
    """ORION_CACHE_DIR (a large disk, where $TMPDIR may be small) also holds the weight
    file a build writes for its compile; unset or not a folder: the system's."""
    import tempfile

    from orion.models import runtime

    folders: list[str | None] = []
    real = tempfile.TemporaryDirectory

    def spy(*args, **kwargs):
        folders.append(kwargs.get("dir"))
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime.tempfile, "TemporaryDirectory", spy)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("ORION_CACHE_DIR", str(cache))
    folder = save_peaked_gpt2(tmp_path / "m", {**TINY, "vocab_size": 1024}, seed=12)
    with load_model(folder, prefill_buckets=(32,), decode_buckets=(64,)) as m:
        m.prefill([1, 2, 3])
    assert folders and all(f == str(cache) for f in folders)
    assert not list(cache.glob("orion-build-*"))          # removed after each compile
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "absent"))
    assert runtime.build_folder() is None
