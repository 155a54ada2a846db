from __future__ import annotations

import numpy as np

from orion.tokenizers.sentencepiece import SentencePieceTokenizer
from orion.train.data import Batches, TokenData, tokenize_file


def test_tokenize_once_and_sample(tmp_path, shakespeare, sp_model):
    tok = SentencePieceTokenizer(sp_model)
    out = tokenize_file(shakespeare, tok, tmp_path / "t.tokens", bos_id=tok.bos_token_id)
    mtime = out.stat().st_mtime_ns
    assert tokenize_file(shakespeare, tok, tmp_path / "t.tokens") == out
    assert out.stat().st_mtime_ns == mtime  # reused, not rewritten
    data = TokenData(out, val_fraction=0.1)
    assert isinstance(data.tokens, np.memmap) and data.tokens.dtype == np.uint16
    assert tok.decode(data.tokens[1:40].tolist()) == \
        shakespeare.read_text()[: len(tok.decode(data.tokens[1:40].tolist()))]
    assert len(data.train) + len(data.val) == len(data.tokens)
    b = Batches(data.train, batch=3, seq=16, seed=1)
    x, y = b.next()
    assert x.shape == y.shape == (3, 16)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])


def test_batches_resume_from_state(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    a = Batches(tokens, 2, 8, seed=5)
    a.next()
    state = a.state_dict()
    expect = [a.next() for _ in range(3)]
    b = Batches(tokens, 2, 8, seed=99)
    b.load_state_dict(state)
    for (x0, y0), (x1, y1) in zip(expect, [b.next() for _ in range(3)], strict=True):
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)


def test_fixed_windows_cover_the_tokens_the_same_every_call():
    from orion.train.data import fixed_windows

    tokens = np.arange(1000, dtype=np.uint16)
    a = fixed_windows(tokens, batch=2, seq=10, count=3)
    assert len(a) == 3 and a[0][0].shape == (2, 10)
    np.testing.assert_array_equal(a[0][0][0], tokens[:10])
    np.testing.assert_array_equal(a[-1][1][-1], tokens[-10:])      # targets end at the end
    for (x, y), (x2, _) in zip(a, fixed_windows(tokens, 2, 10, 3), strict=True):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    assert fixed_windows(tokens[:10], batch=2, seq=10, count=3) == []


def test_rank_shards_are_the_single_process_draws_dealt_out():
    tokens = np.arange(5000, dtype=np.uint16)      # a window's first token is its start
    one = Batches(tokens, 2, 8, seed=7)
    alone = [one.next()[0][:, 0].tolist() for _ in range(6)]
    shards = [Batches(tokens, 2, 8, seed=7, rank=r, world=3) for r in range(3)]
    dealt = [[s.next()[0][:, 0].tolist() for s in shards] for _ in range(2)]
    # micro-batch k*world + r of the lone process is rank r's k-th
    assert [m for k in dealt for m in k] == alone
    assert [s.drawn for s in shards] == [6, 6, 6] and one.drawn == 6
    assert len({s.rng.bit_generator.state["state"]["state"] for s in shards}) == 1


def test_skip_moves_past_micro_batches_unread():
    tokens = np.arange(5000, dtype=np.uint16)
    a, b = Batches(tokens, 2, 8, seed=1, rank=1, world=2), Batches(tokens, 2, 8, seed=1,
                                                                      rank=1, world=2)
    a.next()
    b.skip(1)
    np.testing.assert_array_equal(a.next()[0], b.next()[0])
