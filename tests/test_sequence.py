"""orion.runtime.sequence: evals and host copies declared once and run by one C call give what
the same steps give run one by one, put each copied byte where its geometry says, and
refuse bad steps and stale handles with an error naming the step."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from test_runtime import C, S, conv_mil, reference_conv, weights

from orion.errors import InvalidArgumentError, ReleasedError, StateError
from orion.runtime import Program, Surface
from orion.runtime.sequence import EvalSequence, live_sequences

pytestmark = pytest.mark.native

W1, W2 = "@model_path/weights/w1.bin", "@model_path/weights/w2.bin"


@pytest.fixture
def two_convs(backend):
    """Two loaded 1x1 convs with their own weights: y = W1 x and y = W2 x."""
    (f1, w1), (f2, w2) = weights(1, W1), weights(2, W2)
    p1 = Program.compile(conv_mil(W1), f1, backend=backend)
    p2 = Program.compile(conv_mil(W2), f2, backend=backend)
    p1.load()
    p2.load()
    yield p1, w1, p2, w2
    p1.release()
    p2.release()


def _surfaces(n: int) -> list[Surface]:
    return [Surface(C * S * 2) for _ in range(n)]


def test_a_sequence_computes_what_its_steps_compute_one_by_one(no_leaks, two_convs):
    p1, w1, p2, w2 = two_convs
    x = np.random.default_rng(3).standard_normal((C, S)).astype(np.float16)
    x_in, y1, x2, y2, log = _surfaces(5)
    x_in.write(x)
    seq = EvalSequence()
    seq.eval(p1, [x_in], [y1])
    seq.copy(y1, x2, row_bytes=C * S * 2)
    seq.eval(p2, [x2], [y2])
    # the first 4 columns of channel 0 of y2, into row `position` of a log
    seq.copy(y2, log, row_bytes=8, dst_step=8)
    for position in (0, 3):
        seq.run(position)
    got, logged = y2.read((C, S)), log.read((C * S,))
    assert seq.steps == 4

    by_hand = _surfaces(3)
    p1.eval([x_in], [by_hand[0]])
    by_hand[1].write(by_hand[0].read((C, S)))
    p2.eval([by_hand[1]], [by_hand[2]])
    np.testing.assert_array_equal(got, by_hand[2].read((C, S)))
    np.testing.assert_allclose(got, reference_conv(w2, reference_conv(w1, x)),
                               atol=5e-2, rtol=2e-2)
    expect = np.zeros(C * S, np.float16)
    expect[0:4] = expect[12:16] = got[0, :4]
    np.testing.assert_array_equal(logged, expect)
    seq.release()
    for s in [x_in, y1, x2, y2, log, *by_hand]:
        s.release()


def test_a_strided_copy_writes_exactly_its_rows_at_the_position():
    src, dst = Surface(4096), Surface(4096)
    pattern = np.arange(2048, dtype=np.uint16)
    src.numpy(np.uint16, (2048,))[...] = pattern
    seq = EvalSequence()
    seq.copy(src, dst, rows=3, row_bytes=6, src_offset=2, src_stride=16,
             dst_offset=4, dst_stride=40, dst_step=10)
    seq.run(5)
    expect = np.zeros(4096, np.uint8)
    raw = pattern.view(np.uint8)
    for r in range(3):
        at = 4 + 5 * 10 + r * 40
        expect[at: at + 6] = raw[2 + r * 16: 2 + r * 16 + 6]
    np.testing.assert_array_equal(dst.read((4096,), np.uint8), expect)
    seq.release()
    src.release()
    dst.release()


@pytest.mark.parametrize("geometry, words", [
    ({"row_bytes": 0}, "must be > 0"),
    ({"row_bytes": 8, "rows": 0}, "must be > 0"),
    ({"row_bytes": 8, "rows": 2, "src_stride": 4, "dst_stride": 8}, "overlap"),
    ({"row_bytes": 4097}, "past the end of its 4096-byte source"),
    ({"row_bytes": 8, "dst_offset": 4092}, "writes past the end of its 4096-byte destination"),
    ({"row_bytes": 8, "rows": 2, "src_stride": 2**63, "dst_stride": 8}, "reads past the end"),
])
def test_bad_copies_are_refused_when_added(geometry, words):
    src, dst = Surface(4096), Surface(4096)
    seq = EvalSequence()
    with pytest.raises(InvalidArgumentError, match=words):
        seq.copy(src, dst, **geometry)
    with pytest.raises(InvalidArgumentError, match="same surface"):
        seq.copy(src, src, row_bytes=8)
    with pytest.raises(ValueError, match="dst_step must be >= 0"):
        seq.copy(src, dst, row_bytes=8, dst_step=-1)
    assert seq.steps == 0
    seq.run(7)   # nothing was added: a run does nothing
    seq.release()
    src.release()
    dst.release()


def test_a_position_past_the_destination_fails_naming_the_step():
    src, dst = Surface(4096), Surface(4096)
    seq = EvalSequence()
    seq.copy(src, dst, row_bytes=8, dst_step=8)
    seq.run(511)                     # the last row that fits
    with pytest.raises(InvalidArgumentError, match=r"sequence step 0 \(copy\).*position 512"):
        seq.run(512)
    with pytest.raises(InvalidArgumentError, match="overflows"):
        seq.run(2**62)
    with pytest.raises(ValueError, match=">= 0"):
        seq.run(-1)
    seq.release()
    src.release()
    dst.release()


def test_an_eval_is_checked_when_added_and_when_run(no_leaks, two_convs):
    p1, _, p2, _ = two_convs
    a, b, c = _surfaces(3)
    seq = EvalSequence()
    with pytest.raises(InvalidArgumentError, match="takes 1 inputs and 1 outputs"):
        seq.eval(p1, [a, b], [c])
    seq.eval(p1, [a], [b])
    seq.copy(b, a, row_bytes=64)
    seq.eval(p2, [a], [c])
    assert seq.ready()
    p2.unload()
    assert not seq.ready()
    # the run stops before its first step: step 0's output and step 1's copy stay as they are
    before = np.arange(C * S, dtype=np.float16).reshape(C, S)
    a.write(before)
    b.write(before + 1)
    with pytest.raises(StateError, match=r"sequence step 2 \(eval\).*not loaded; no step ran"):
        seq.run()
    np.testing.assert_array_equal(a.read((C, S)), before)
    np.testing.assert_array_equal(b.read((C, S)), before + 1)
    p2.load()
    assert seq.ready()
    seq.run()
    assert not np.array_equal(b.read((C, S)), before + 1)
    handle = p2.handle
    p2.release()     # the sequence holds the Python object; its C handle is stale now
    with pytest.raises(ReleasedError, match=rf"sequence step 2 \(eval\).*0x{handle:x}"):
        seq.run()
    with pytest.raises(ReleasedError, match=rf"sequence step 2 \(eval\).*0x{handle:x}"):
        seq.ready()
    seq.release()
    seq.release()    # idempotent
    with pytest.raises(ValueError, match="released"):
        seq.run()
    for s in (a, b, c):
        s.release()


def test_a_released_surface_fails_the_copy_that_uses_it():
    src, dst = Surface(4096), Surface(4096)
    seq = EvalSequence()
    seq.copy(src, dst, row_bytes=8)
    dst.release()
    with pytest.raises(ReleasedError, match=r"sequence step 0 \(copy\).*copy destination"):
        seq.run()
    seq.release()
    src.release()


def test_sequences_are_freed():
    gc.collect()
    before = live_sequences()
    seqs = [EvalSequence() for _ in range(5)]
    assert live_sequences() == before + 5
    seqs[0].release()
    del seqs
    gc.collect()
    assert live_sequences() == before
