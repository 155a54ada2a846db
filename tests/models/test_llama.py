"""A Llama through the one runtime: logits against the numpy reference, decode against
prefill, and loading through orion.load (HF folder and llama2.c .bin)."""

from __future__ import annotations

import numpy as np
import pytest
from asset_paths import require_asset

from models.llama_args import llama
from models.llama_reference import forward
from orion.formats.llama2c import write_llama2c
from orion.models import default_model_path, load_model
from orion.models.decode_sequence import DecodeSequences
from orion.models.runtime import TransformerLM
from orion.models.weights import ArrayWeights, init_weights, save_folder
from orion.tokenizers.sentencepiece import SentencePieceTokenizer

ARCH = llama(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=32000, hidden_dim=96,
             max_seq_len=64)
CFG = ARCH.args


def LlamaLM(cfg, w, tokenizer, backend):  # noqa: N802 - the old constructor's shape
    return TransformerLM(ARCH, ArrayWeights(w), tokenizer, backend=backend)


def _backend() -> str:
    try:
        from orion.runtime import backends

        return "vane" if "vane" in backends() else "reference"
    except Exception:  # noqa: BLE001 - no library: the numpy reference stands in
        return "reference"


@pytest.fixture(scope="module")
def tokenizer():
    return SentencePieceTokenizer(require_asset("llama2/tokenizer.model"))


@pytest.mark.slow
def test_prefill_and_decode_match_reference(tokenizer):
    w = init_weights(ARCH, 4)
    ids = tokenizer.encode("Once upon a time there was a little", bos=True)
    ref, _ = forward(CFG, w, np.array([ids]))
    with LlamaLM(CFG, w, tokenizer, backend=_backend()) as m:
        logits = m.prefill(ids, all_logits=True)
        np.testing.assert_allclose(logits, ref[0], atol=2e-2 * np.abs(ref).max())
        last = m.prefill(ids[:-1])
        np.testing.assert_allclose(last, ref[0, -2], atol=2e-2 * np.abs(ref).max())
        step = m.decode(ids[-1])
        np.testing.assert_allclose(step, logits[-1], atol=1e-3 * np.abs(ref).max())
        assert m.position == len(ids)
        compiled = m.stats.programs_compiled
        m.reset()
        m.prefill(ids)
        assert m.stats.programs_compiled == compiled  # bucket programs are reused


@pytest.mark.slow
def test_decode_in_one_call_equals_decode_a_layer_at_a_time(tokenizer, monkeypatch):
    """Decode runs its layers as one C sequence when they all fit the device, else
    from Python a layer at a time: the same logits and cache, bit for bit."""
    if _backend() != "vane":
        pytest.skip("needs the orion library (vane): the numpy reference has no programs; "
                    "runs wherever the library is built (CI's plain and sanitizer passes)")
    w = init_weights(ARCH, 6)
    ids = tokenizer.encode("Once upon a time", bos=True)
    tokens = [5, 900, 31999, 7]
    with LlamaLM(CFG, w, tokenizer, backend="vane") as m:
        def decode_all() -> tuple[np.ndarray, list[np.ndarray]]:
            m.prefill(ids)
            logits = np.stack([m.decode(t) for t in tokens])
            return logits, [f.copy() for f in m._cache._flats]

        one_call, cache_one = decode_all()
        # as a model whose programs never all fit: no sequence is built to run again
        monkeypatch.setattr(TransformerLM, "_all_loaded", lambda self, progs: False)
        monkeypatch.setattr(DecodeSequences, "rerun", lambda self, cache, pos: False)
        by_layer, cache_layer = decode_all()
    np.testing.assert_array_equal(one_call, by_layer)
    for a, b in zip(cache_one, cache_layer, strict=True):
        np.testing.assert_array_equal(a, b)
    ref, _ = forward(CFG, w, np.array([ids + tokens]))
    np.testing.assert_allclose(one_call, ref[0, len(ids):],
                               atol=2e-2 * np.abs(ref).max())


@pytest.mark.slow
def test_decode_reruns_its_sequence_and_reloads_a_program_unloaded_between_tokens(
        tokenizer, monkeypatch):
    """After a bucket's first token, decode runs the bucket's sequence again without
    looking its programs up; a program unloaded in between is loaded again first, and
    the logits are those of a model left alone, bit for bit."""
    if _backend() != "vane":
        pytest.skip("needs the orion library (vane): the numpy reference has no programs; "
                    "runs wherever the library is built (CI's plain and sanitizer passes)")
    w = init_weights(ARCH, 7)
    ids = tokenizer.encode("Once upon a time", bos=True)
    tokens = [5, 900, 31999, 7, 42, 1000]

    def run(unload_at: int | None) -> tuple[np.ndarray, list[int]]:
        checked: list[int] = []
        real = TransformerLM._decode_checked
        monkeypatch.setattr(TransformerLM, "_decode_checked", lambda self, cache, pos: (
            checked.append(pos), real(self, cache, pos))[1])
        try:
            with LlamaLM(CFG, w, tokenizer, backend="vane") as m:
                m.prefill(ids)
                out = []
                for i, t in enumerate(tokens):
                    if i == unload_at:
                        next(p for k, p in m._programs.items()
                             if k.kind == "decode" and 1 in k.layers).unload()
                    out.append(m.decode(t))
                return np.stack(out), checked
        finally:
            monkeypatch.undo()

    left_alone, checked = run(None)
    assert checked == [len(ids)]
    reloaded, checked = run(3)
    assert checked == [len(ids), len(ids) + 3]
    np.testing.assert_array_equal(reloaded, left_alone)


@pytest.mark.slow
def test_decode_over_the_live_cache_rows_keeps_the_bits_of_the_whole_cache(
        tokenizer, monkeypatch):
    """The cache promises vane that each head's rows past the ones written are zero
    (Surface.set_zero_tail), so attention reads only the live rows: the logits equal,
    bit for bit, those of a model that makes no promise and reads every row."""
    if _backend() != "vane":
        pytest.skip("needs the orion library (vane): the numpy reference has no surfaces; "
                    "runs wherever the library is built (CI's plain and sanitizer passes)")
    from orion.models.kv_cache import KVCache

    w = init_weights(ARCH, 9)
    ids = tokenizer.encode("Once upon a time", bos=True)
    tokens = [5, 900, 31999, 7, 42, 1000, 3]

    def run() -> tuple[np.ndarray, set[tuple[int, int]], int]:
        with LlamaLM(CFG, w, tokenizer, backend="vane") as m:
            out = [m.prefill(ids), *(m.decode(t) for t in tokens)]
            return np.stack(out), {s.zero_tail() for s in (*m._k, *m._v)}, m._cache.bucket

    promised, tails, bucket = run()
    hd, n = CFG.head_dim, len(ids) + len(tokens)
    assert tails == {(bucket * hd * 2, n * hd * 2)}
    monkeypatch.setattr(KVCache, "_promise", lambda self, layers: None)
    whole, tails, _ = run()
    assert tails == {(0, 0)}
    np.testing.assert_array_equal(promised.view(np.uint32), whole.view(np.uint32))


def test_decode_rope_rows_come_from_blocks_with_the_bits_of_one_row(tokenizer):
    """Decode writes each position's RoPE row from a block worked out at once: the
    same bits as the row alone, in any order of positions, across blocks."""
    rope = ARCH.attention(0).rope
    with LlamaLM(CFG, init_weights(ARCH, 8), tokenizer, backend=_backend()) as m:
        for pos in (70, 5, 63, 64, 127, 128, 0, 63):
            np.testing.assert_array_equal(m._rope_row(rope, pos), rope.rows(pos, 1)[0])


@pytest.mark.slow
def test_orion_load_reads_hf_folder_and_llama2c(tmp_path, tokenizer):
    w = init_weights(ARCH, 5)
    ids = tokenizer.encode("Hello world")
    save_folder(tmp_path / "hf", ARCH, w)
    sp = require_asset("llama2/tokenizer.model").read_bytes()
    (tmp_path / "hf" / "tokenizer.model").write_bytes(sp)
    (tmp_path / "c").mkdir()
    write_llama2c(tmp_path / "c" / "model.bin", ARCH.to_config(), w, version=1)
    (tmp_path / "c" / "tokenizer.model").write_bytes(sp)
    outs = []
    for path in (tmp_path / "hf", tmp_path / "c" / "model.bin"):
        m = load_model(path, backend=_backend())
        try:
            assert isinstance(m, TransformerLM) and m.arch == ARCH
            outs.append(m.prefill(ids))
        finally:
            m.close()
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-3)


@pytest.mark.slow
def test_shipped_model_writes_shakespeare():
    path = default_model_path()
    if not (path / "model.safetensors").exists():
        pytest.fail(f"the shipped model is missing from {path}")
    m = load_model(path, backend=_backend())
    try:
        ids = m.tokenizer.encode("ROMEO:")
        logits = m.prefill(ids)
        out = []
        for _ in range(24):
            tok = int(np.argmax(logits))
            out.append(tok)
            logits = m.decode(tok)
        text = m.tokenizer.decode(out)
    finally:
        m.close()
    words = [t.strip(".,;:!?'").lower() for t in text.split()]
    common = {"the", "and", "i", "to", "of", "my", "you", "a", "that", "is", "in", "not", "me",
              "with", "it", "be", "your", "his", "this", "for", "thou", "thy", "have", "will"}
    assert sum(wd in common for wd in words) >= 3, text
