"""orion.models.kv_cache: the head-major decode cache, on its own against a
position-major reference, and in GPT-2 and the Llama family across decode buckets
(up into a larger bucket, back down after truncate, reset and the prompt cache)
against the numpy GPT-2 reference and transformers."""

from __future__ import annotations

import numpy as np
import pytest

from models.gpt2_reference import forward
from orion.ir.composites import MASK_VALUE
from orion.models.kv_cache import KVCache

KV, HD, LAYERS, BUCKETS = 3, 4, 2, (32, 64, 128)


class Reference:
    """What the cache must hold: position-major keys and values, and the mask."""

    def __init__(self) -> None:
        self.k = np.zeros((LAYERS, BUCKETS[-1], KV, HD), np.float16)
        self.v = np.zeros_like(self.k)
        self.visible = 0


def _cache() -> tuple[KVCache, list[np.ndarray], np.ndarray]:
    flats = [np.full(KV * BUCKETS[-1] * HD, 7, np.float16) for _ in range(2 * LAYERS)]
    mask = np.zeros(BUCKETS[-1], np.float16)
    return KVCache(flats[:LAYERS], flats[LAYERS:], {0: mask}, KV, HD, BUCKETS), flats, mask


def _check(cache: KVCache, flats: list[np.ndarray], mask: np.ndarray, ref: Reference,
           n: int) -> None:
    """Head h, position t of layer i sits at (h * T + t) * hd of the layer's flat
    surface for the bucket T laid out; every other item is zero."""
    t = cache.bucket
    for i in range(LAYERS):
        for flat, want in ((flats[i], ref.k[i]), (flats[LAYERS + i], ref.v[i])):
            expect = np.zeros_like(flat)
            heads = expect[: KV * t * HD].reshape(KV, t, HD)
            heads[:, :n] = want[:n].transpose(1, 0, 2)
            np.testing.assert_array_equal(flat, expect)
    assert (mask[: ref.visible] == 0).all()
    assert (mask[ref.visible:] == MASK_VALUE).all()


def test_cache_moves_between_bucket_layouts_and_keeps_the_rest_zero():
    rng = np.random.default_rng(0)
    cache, flats, mask = _cache()
    ref = Reference()
    _check(cache, flats, mask, ref, 0)              # the constructor zeroes and masks

    n = 20                                          # prefill: [KVD, n] program outputs
    for i in range(LAYERS):
        k, v = (rng.standard_normal((n, KV, HD)).astype(np.float16) for _ in range(2))
        ref.k[i, :n], ref.v[i, :n] = k, v
        cache.fill(i, k.reshape(n, KV * HD).T, v.reshape(n, KV * HD).T)
    cache.commit(0, n)
    ref.visible = n
    _check(cache, flats, mask, ref, n)

    for pos in range(n, 70):                        # decode, up through 32 -> 64 -> 128
        cache.lay_out(next(b for b in BUCKETS if b > pos))
        for i in range(LAYERS):
            k, v = (rng.standard_normal((KV, HD)).astype(np.float16) for _ in range(2))
            ref.k[i, pos], ref.v[i, pos] = k, v
            cache.append(i, pos, k, v)
        cache.commit(pos, pos + 1)
        ref.visible = pos + 1
        if pos in (31, 32, 63, 64):
            _check(cache, flats, mask, ref, pos + 1)
    assert cache.bucket == 128

    cache.truncate(25)                              # then back down to 32
    ref.k[:, 25:] = ref.v[:, 25:] = 0
    ref.visible = 25
    _check(cache, flats, mask, ref, 25)
    cache.lay_out(32)
    _check(cache, flats, mask, ref, 25)

    cache.clear()
    ref = Reference()
    _check(cache, flats, mask, ref, 0)


def test_window_masks_show_each_step_its_window():
    """A window-W mask shows the step at p the positions p - W + 1 .. p - 1 of the cache
    (the token itself joins inside the program), through commits, a truncate that
    opens positions again, and clear; the full mask shows every written position."""
    full, windowed = np.zeros(128, np.float16), np.zeros(128, np.float16)
    flats = [np.zeros(KV * 128 * HD, np.float16) for _ in range(2)]
    cache = KVCache(flats[:1], flats[1:], {0: full, 8: windowed}, KV, HD, (128,))

    def visible(m: np.ndarray) -> list[int]:
        return [int(j) for j in np.flatnonzero(m == 0)]

    cache.commit(0, 5)                       # a prompt of 5: the step at 5 sees 0 .. 4
    assert visible(full) == visible(windowed) == list(range(5))
    for pos in range(5, 20):
        cache.commit(pos, pos + 1)
    assert visible(full) == list(range(20))
    assert visible(windowed) == list(range(13, 20))   # the step at 20: 13 .. 19, and 20
    cache.truncate(10)                        # the step at 10: 3 .. 9 open again
    assert visible(full) == list(range(10))
    assert visible(windowed) == list(range(3, 10))
    cache.clear()
    assert visible(full) == visible(windowed) == []


def test_lay_out_refuses_a_bucket_smaller_than_the_written_rows():
    cache, _, _ = _cache()
    cache.lay_out(64)
    cache.append(0, 40, np.ones((KV, HD), np.float16), np.ones((KV, HD), np.float16))
    with pytest.raises(ValueError, match="cannot hold the 41 written"):
        cache.lay_out(32)


# ---- GPT-2 -----------------------------------------------------------------------------

ATOL = 0.02   # as tests/models/test_gpt2.py: fp16 activations against fp32
IDS = [int(i) for i in np.random.default_rng(1).integers(0, 50257, 80)]


@pytest.mark.native
@pytest.mark.usefixtures("gpt2_compile_budget")
def test_gpt2_decodes_across_buckets_and_back_down(tiny_gpt2):
    """Decode buckets (32, 64, 128): prompt 20, decode past 32 into 64, truncate to 20
    (the next step is in bucket 32 again), decode on; every step's logits are the fp32
    reference's for the sequence the cache holds."""
    m = tiny_gpt2
    m.prefill(IDS[:20])
    up = np.stack([m.decode(t) for t in IDS[20:40]])
    np.testing.assert_allclose(up, forward(m.config, m.weights, IDS[:40])[20:], atol=ATOL,
                               rtol=0)
    m.truncate(20)
    down = np.stack([m.decode(t) for t in IDS[60:66]])
    ref = forward(m.config, m.weights, IDS[:20] + IDS[60:66])
    np.testing.assert_allclose(down, ref[20:], atol=ATOL, rtol=0)


@pytest.mark.native
@pytest.mark.usefixtures("gpt2_compile_budget")
def test_gpt2_prompt_cache_reuses_a_prefix_across_a_bucket_change(tiny_gpt2):
    """The server's prompt cache: turn one fills positions past 32 (bucket 64); turn
    two shares 24 tokens of it, so the cache is cut to 24 and moves back to bucket 32."""
    from orion.models.prefix_cache import PrefixCachedLM

    cached = PrefixCachedLM(tiny_gpt2, policy="always")
    cached.prefill(IDS[:30])
    for t in IDS[30:45]:
        cached.decode(t)
    turn_two = IDS[:24] + IDS[50:60]
    got = cached.prefill(turn_two)
    assert cached.last_cached_tokens == 24
    np.testing.assert_allclose(got, forward(tiny_gpt2.config, tiny_gpt2.weights,
                                            turn_two)[-1], atol=ATOL, rtol=0)


# ---- the Llama family --------------------------------------------------------------------

# transformers' random init of published configs, shrunk (hf_fixtures), with a
# 2048-token vocabulary: these tests are about the cache, and a 151,936-row classifier
# would be most of their time. Qwen3-0.6B keeps its GQA (2 query heads per key head),
# head_dim 128; "Qwen3-4B" is its shape where D = 2560 is not a multiple of KVD = 1024
# (shrunk by 8: D 320, KVD 128), so a decode row folds into 3 rows of 128, padded; the
# made-up "hd48" has KVD = 48, not a multiple of 32, so the surface rows are 96 wide
# and hold two positions of the cache's single head.
# name: (published config, changes, the decode row layout (rows, width) expected)
LLAMA_CONFIGS = {
    "Qwen3-0.6B-gqa": ("Qwen3-0.6B", {}, (1, 256)),
    "Qwen3-4B-rows": ("Qwen3-0.6B", {"hidden_size": 320, "num_attention_heads": 4,
                                     "num_key_value_heads": 1}, (3, 128)),
    "hd48": ("Llama-3.2-1B", {"hidden_size": 144, "head_dim": 48, "num_attention_heads": 4,
                              "num_key_value_heads": 1, "intermediate_size": 256,
                              "rope_scaling": None}, (2, 96)),
}
ULPS = 8 * 2.0 ** -11   # as test_llama_hf: 8 fp16 ulps of the largest logit


def _close(ours: np.ndarray, ref: np.ndarray) -> None:
    tol = ULPS * float(np.abs(ref).max())
    worst = float(np.abs(ours - ref).max())
    assert worst <= tol, f"max |orion - transformers| = {worst:.5f} > {tol:.5f}"


@pytest.mark.slow
@pytest.mark.native
@pytest.mark.usefixtures("gpt2_compile_budget")
@pytest.mark.parametrize("which", list(LLAMA_CONFIGS))
def test_llama_decodes_across_buckets_and_back_down(tmp_path, which):
    torch = pytest.importorskip("torch", reason="torch (test-only) is the reference")
    from orion.models import load_model
    from orion.models.blocks import RowLayout

    from .hf_fixtures import hf_reference, save_hf_model, shrunk

    base, changes, layout = LLAMA_CONFIGS[which]
    config = {**shrunk(base), **changes, "vocab_size": 2048, "num_hidden_layers": 2,
              "bos_token_id": 0, "eos_token_id": 1}
    folder = save_hf_model(tmp_path, config)
    ref = hf_reference(folder)
    ids = np.random.default_rng(2).integers(0, 2048, 60).tolist()

    def expected(seq: list[int]) -> np.ndarray:
        with torch.no_grad():
            return ref(torch.tensor([seq])).logits[0].numpy()

    with load_model(folder, prefill_buckets=(32,), decode_buckets=(32, 64)) as m:
        assert RowLayout.of(m.arch) == RowLayout(*layout)
        first = m.prefill(ids[:20])
        up = [m.decode(t) for t in ids[20:40]]          # 20 -> 40: bucket 32, then 64
        _close(np.stack([first, *up]), expected(ids[:40])[19:])
        m.reset()                                        # a short prompt: bucket 32 again
        again = [m.prefill(ids[40:50]), *(m.decode(t) for t in ids[50:54])]
        _close(np.stack(again), expected(ids[40:54])[9:])


@pytest.mark.native
def test_a_sequence_copy_by_append_copy_writes_what_append_writes():
    """`append_copy` is append's byte geometry: a C sequence copying a [KV, hd] row with
    it leaves the cache surfaces as `append` leaves them, in every bucket layout; and the
    surfaces' zero-tail promise follows the rows written (one block per head of the
    bucket, live up to `used`) through lay_out, the copies, truncate and clear."""
    from orion.runtime import Surface
    from orion.runtime.sequence import EvalSequence

    n = KV * BUCKETS[-1] * HD
    surfaces = [Surface(2 * n) for _ in range(2 * LAYERS)]
    k_new, v_new = Surface(2 * KV * HD), Surface(2 * KV * HD)
    mask = np.zeros(BUCKETS[-1], np.float16)
    by_copy = KVCache([s.numpy(np.float16, (n,)) for s in surfaces[:LAYERS]],
                      [s.numpy(np.float16, (n,)) for s in surfaces[LAYERS:]], {0: mask.copy()},
                      KV, HD, BUCKETS, surfaces=surfaces)

    def promised(cache: KVCache) -> set[tuple[int, int]]:
        return {s.zero_tail() for s in surfaces} | {(cache.bucket * HD * 2, cache.used * HD * 2)}

    assert promised(by_copy) == {(BUCKETS[0] * HD * 2, 0)}
    by_append, flats, _ = _cache()
    rng = np.random.default_rng(4)
    for pos in (0, 1, 31, 32, 70):
        by_copy.lay_out(by_copy.bucket_for(pos))
        by_append.lay_out(by_append.bucket_for(pos))
        seq = EvalSequence()
        rows = by_copy.append_copy()
        for i in range(LAYERS):
            seq.copy(k_new, surfaces[i], **rows)
            seq.copy(v_new, surfaces[LAYERS + i], **rows)
        k, v = (rng.standard_normal((KV, HD)).astype(np.float16) for _ in range(2))
        k_new.write(k)
        v_new.write(v)
        seq.run(pos)
        by_copy.appended(pos)
        for i in range(LAYERS):
            by_append.append(i, pos, k, v)
        for s, flat in zip(surfaces, flats, strict=True):
            np.testing.assert_array_equal(s.read((n,)), flat)
        assert by_copy.used == by_append.used == pos + 1
        assert len(promised(by_copy)) == 1      # the copies widened it themselves
        seq.release()
    by_copy.truncate(10)
    assert promised(by_copy) == {(BUCKETS[-1] * HD * 2, 10 * HD * 2)}
    by_copy.clear()
    assert promised(by_copy) == {(BUCKETS[-1] * HD * 2, 0)}
    for i in range(LAYERS):
        by_copy.fill(i, np.ones((KV * HD, 5), np.float16), np.ones((KV * HD, 5), np.float16))
    assert promised(by_copy) == {(BUCKETS[-1] * HD * 2, 5 * HD * 2)}
