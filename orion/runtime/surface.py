"""A `Surface`: a tensor buffer shared with the backend without copies; its `numpy()`
view writes straight into the memory a program reads."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from orion.errors import InvalidArgumentError, ReleasedError
from orion.runtime._native import check, ffi, lib

MIN_SURFACE_BYTES = 49152  # ANE-C23


class _SurfaceRef:
    """One C reference to a surface; numpy views keep one alive each."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self._lock = threading.Lock()
        self._released = False

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        check(lib.orion_surface_release(self.handle))

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the process frees it
            pass


class Surface:
    """A buffer the backend reads and writes; tensors are fp16 [1, C, 1, S], packed."""

    def __init__(self, nbytes: int, *, _handle: int | None = None) -> None:
        if _handle is None:
            out = ffi.new("orion_surface *")
            check(lib.orion_surface_create(int(nbytes), out))
            _handle = int(out[0])
        self._ref: _SurfaceRef | None = _SurfaceRef(_handle)
        size = ffi.new("uint64_t *")
        check(lib.orion_surface_alloc_size(_handle, size))
        self.nbytes = int(size[0])

    @classmethod
    def tensor(cls, channels: int, seq: int) -> Surface:
        """A surface sized for an fp16 tensor [1, channels, 1, seq]."""
        out = ffi.new("orion_surface *")
        check(lib.orion_surface_create_tensor(int(channels), int(seq), out))
        return cls(0, _handle=int(out[0]))

    @property
    def handle(self) -> int:
        if self._ref is None:
            raise ReleasedError("surface was released")
        return self._ref.handle

    @property
    def released(self) -> bool:
        return self._ref is None

    def release(self) -> None:
        """Drops this object's reference; numpy views keep the memory until they go."""
        if self._ref is not None:
            ref, self._ref = self._ref, None
            ref.release()

    def __enter__(self) -> Surface:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def numpy(
        self, dtype: np.dtype | type = np.float16, shape: Sequence[int] | None = None
    ) -> np.ndarray:
        """A zero-copy view of the surface (the whole of it, or the first prod(shape) items)."""
        handle = self.handle
        dt = np.dtype(dtype)
        count = self.nbytes // dt.itemsize if shape is None else int(np.prod(shape))
        if count * dt.itemsize > self.nbytes:
            raise InvalidArgumentError(
                f"shape {tuple(shape or ())} of {dt} needs more than {self.nbytes} bytes"
            )
        check(lib.orion_surface_retain(handle))
        keeper = _SurfaceRef(handle)  # released when the last view of the memory dies
        base = ffi.new("void **")
        check(lib.orion_surface_base_address(handle, base))
        # The buffer keeps the gc'd pointer alive; the pointer's destructor
        # drops the surface reference, so no view outlives its memory.
        pointer = ffi.gc(ffi.cast("void *", base[0]), lambda _p: keeper.release())
        arr = np.frombuffer(ffi.buffer(pointer, count * dt.itemsize), dtype=dt, count=count)
        return arr.reshape(tuple(shape)) if shape is not None else arr

    @contextmanager
    def cpu_access(self, read_only: bool = False) -> Iterator[Surface]:
        """Locks the surface for CPU access (IOSurfaceLock on the ane backend, as every
        reference implementation does around host reads and writes); calls nest."""
        handle = self.handle
        flags = lib.ORION_LOCK_READ_ONLY if read_only else 0
        check(lib.orion_surface_lock(handle, flags))
        try:
            yield self
        finally:
            check(lib.orion_surface_unlock(handle, flags))

    def write(self, array: np.ndarray) -> None:
        """Copies an array, converted to fp16, into the surface from byte 0 (packed)."""
        data = np.ascontiguousarray(array, dtype=np.float16).reshape(-1)
        view = self.numpy(np.float16, (data.size,))
        with self.cpu_access():
            view[...] = data
        check(lib.orion_surface_wrote(self.handle, 0, data.nbytes))

    def set_zero_tail(self, block_bytes: int, live_bytes: int) -> None:
        """Promises that, viewed as blocks of `block_bytes`, every byte at or past
        `live_bytes` within its block is zero (0 drops the promise): vane's attention
        products then read only the live rows of a KV cache. Orion's own writes keep it
        (`write`, eval outputs, sequence copies); a write through a `numpy` view is the
        writer's to keep: set it again, or drop it."""
        check(lib.orion_surface_set_zero_tail(self.handle, int(block_bytes), int(live_bytes)))

    def zero_tail(self) -> tuple[int, int]:
        """The promise in force: (block_bytes, live_bytes), (0, 0) for none."""
        block, live = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(lib.orion_surface_zero_tail(self.handle, block, live))
        return int(block[0]), int(live[0])

    def read(self, shape: Sequence[int], dtype: np.dtype | type = np.float16) -> np.ndarray:
        """A copy of the first prod(shape) elements."""
        view = self.numpy(dtype, shape)
        with self.cpu_access(read_only=True):
            return view.copy()


def live_surfaces() -> int:
    return int(lib.orion_surface_live_count())
