"""Surfaces: zero-copy numpy views, release, and use after release."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from orion.errors import InvalidArgumentError, ReleasedError, StateError
from orion.runtime import Surface, _native, live_surfaces

pytestmark = pytest.mark.native


def c_read_fp16(surface: Surface, index: int) -> np.float16:
    """Reads one element through C's own pointer, not through numpy."""
    base = _native.ffi.new("void **")
    _native.check(_native.lib.orion_surface_base_address(surface.handle, base))
    raw = _native.ffi.cast("uint16_t *", base[0])[index]
    return np.array([raw], dtype=np.uint16).view(np.float16)[0]


def c_write_fp16(surface: Surface, index: int, value: float) -> None:
    base = _native.ffi.new("void **")
    _native.check(_native.lib.orion_surface_base_address(surface.handle, base))
    bits = np.array([value], dtype=np.float16).view(np.uint16)[0]
    _native.ffi.cast("uint16_t *", base[0])[index] = int(bits)


def test_numpy_view_is_zero_copy_both_ways(no_leaks):
    with Surface.tensor(768, 64) as s:
        view = s.numpy(shape=(768, 64))
        view[3, 5] = 2.5  # element (c=3, s=5) of [1, C, 1, S] is at c*S + s
        assert c_read_fp16(s, 3 * 64 + 5) == np.float16(2.5)
        c_write_fp16(s, 10, -7.25)
        assert view.reshape(-1)[10] == np.float16(-7.25)
        base = _native.ffi.new("void **")
        _native.check(_native.lib.orion_surface_base_address(s.handle, base))
        assert view.__array_interface__["data"][0] == int(_native.ffi.cast("uintptr_t", base[0]))
        del view


def test_sizes_and_row_bytes(no_leaks):
    with Surface(100_000) as s:
        assert s.nbytes == 100_000
        row = _native.ffi.new("uint64_t *")
        _native.check(_native.lib.orion_surface_bytes_per_row(s.handle, row))
        assert row[0] == 100_000
        assert np.all(s.numpy(np.uint8) == 0)  # fresh surfaces are zeroed
    with Surface.tensor(256, 96) as s:
        assert s.nbytes == 256 * 96 * 2


@pytest.mark.parametrize("nbytes", [0, 1 << 40])
def test_absurd_sizes_are_refused(nbytes):
    with pytest.raises(InvalidArgumentError):
        Surface(nbytes)


def test_absurd_tensor_shape_is_refused():
    with pytest.raises(InvalidArgumentError, match="channels and seq"):
        Surface.tensor(-1, 32)


def test_use_after_release_is_an_error_not_a_crash(no_leaks):
    s = Surface(4096)
    handle = s.handle
    s.release()
    s.release()  # idempotent
    with pytest.raises(ReleasedError):
        s.numpy()
    # the raw handle is refused by C as well
    with pytest.raises(ReleasedError):
        _native.check(_native.lib.orion_surface_lock(handle, 0))
    with pytest.raises(InvalidArgumentError):
        _native.check(_native.lib.orion_surface_lock(0x7777_0000_0001, 0))


def test_view_keeps_memory_alive_after_release(no_leaks):
    s = Surface.tensor(64, 64)
    view = s.numpy(shape=(64, 64))
    view[:] = 3
    before = live_surfaces()
    s.release()
    assert live_surfaces() == before  # the view still holds a reference
    assert float(view.sum()) == 3 * 64 * 64
    del view
    gc.collect()
    assert live_surfaces() == before - 1


def test_garbage_collection_releases(no_leaks):
    Surface(8192)
    gc.collect()


def test_lock_unlock_nest_and_mismatch_is_refused(no_leaks):
    with Surface(4096) as s:
        lib = _native.lib
        _native.check(lib.orion_surface_lock(s.handle, lib.ORION_LOCK_READ_ONLY))
        _native.check(lib.orion_surface_lock(s.handle, 0))
        _native.check(lib.orion_surface_unlock(s.handle, 0))
        _native.check(lib.orion_surface_unlock(s.handle, lib.ORION_LOCK_READ_ONLY))
        with pytest.raises(StateError):
            _native.check(lib.orion_surface_unlock(s.handle, 0))
        with pytest.raises(InvalidArgumentError):
            _native.check(lib.orion_surface_lock(s.handle, 0x80))


def test_write_and_read_round_trip(no_leaks):
    with Surface.tensor(32, 768) as s:
        data = np.random.default_rng(0).standard_normal((32, 768)).astype(np.float16)
        s.write(data)
        assert np.array_equal(s.read((32, 768)), data)


def test_a_zero_tail_promise_is_kept_by_orion_own_writes(no_leaks, backend):
    """orion_surface_set_zero_tail: set, read back, refused when the live part is longer
    than its block; a write by Orion (Surface.write, an eval's output, a sequence copy)
    widens the live part over what it wrote when that lies in one block, and drops the
    promise when it does not, so the promise never outlives the truth."""
    from test_runtime import C, S, conv_mil, weights

    from orion.runtime import Program
    from orion.runtime.sequence import EvalSequence

    s = Surface(C * S * 2)
    assert s.zero_tail() == (0, 0)
    s.set_zero_tail(4096, 128)
    assert s.zero_tail() == (4096, 128)
    with pytest.raises(InvalidArgumentError, match="4097 live bytes in blocks of 4096"):
        s.set_zero_tail(4096, 4097)
    assert s.zero_tail() == (4096, 128)
    s.write(np.ones(100, np.float16))          # 200 bytes of block 0
    assert s.zero_tail() == (4096, 200)
    s.write(np.ones(3000, np.float16))         # 6000 bytes: past block 0
    assert s.zero_tail() == (0, 0)

    folder, _ = weights()
    program = Program.compile(conv_mil(), folder, backend=backend)
    program.load()
    x, y = Surface(C * S * 2), Surface(C * S * 2)
    y.set_zero_tail(2 * C * S, 0)              # one block: the output lies in it
    program.eval([x], [y])
    assert y.zero_tail() == (2 * C * S, 2 * C * S)
    y.set_zero_tail(1024, 0)                   # the output spans blocks
    program.eval([x], [y])
    assert y.zero_tail() == (0, 0)

    seq = EvalSequence()                       # rows of 8 bytes at 4096 * r + 16 * position
    seq.copy(x, y, rows=3, row_bytes=8, src_stride=8, dst_stride=4096, dst_step=16)
    y.set_zero_tail(4096, 32)
    seq.run(1)                                 # bytes 16..24 of each block: inside the live part
    assert y.zero_tail() == (4096, 32)
    seq.run(5)
    assert y.zero_tail() == (4096, 88)
    y.set_zero_tail(2048, 0)                   # rows at 80 of blocks 0, 2 and 4
    seq.run(5)
    assert y.zero_tail() == (2048, 88)
    seq.release()
    seq = EvalSequence()
    seq.copy(x, y, rows=1, row_bytes=8, dst_offset=2044)   # straddles two blocks
    seq.run(0)
    assert y.zero_tail() == (0, 0)
    seq.release()
    s.set_zero_tail(0, 0)
    assert s.zero_tail() == (0, 0)
    program.release()
    for t in (s, x, y):
        t.release()
