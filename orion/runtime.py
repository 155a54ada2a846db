"""Surfaces and programs over the C interface.

A `Surface` is a tensor buffer shared with the backend without copies: its
`numpy()` view writes straight into the memory the program reads. A `Program`
follows the device's life cycle: compile (weights baked) -> load -> eval ->
unload -> patch weights in place -> load again, without a recompile.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from orion._native import check, ffi, lib, read_string
from orion.blob import _patches
from orion.errors import BackendUnavailableError, InvalidArgumentError, ReleasedError
from orion.files import MAX_WEIGHT_BYTES, read_bytes

NUMERICS = {"fp16": lib.ORION_NUMERICS_FP16, "strict": lib.ORION_NUMERICS_STRICT}
MIN_SURFACE_BYTES = 49152  # ANE-C23


# ---- surfaces ---------------------------------------------------------------


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


# ---- programs ---------------------------------------------------------------


@dataclass(frozen=True)
class IOInfo:
    """A program input or output: MIL name, shape, dtype, packed byte size."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int


def _io_info(handle: int, is_output: bool, index: int) -> IOInfo:
    info = ffi.new("orion_io_info *")
    check(lib.orion_program_io(handle, int(is_output), index, info))
    dtype = np.dtype(np.float16 if info.dtype == lib.ORION_BLOB_FLOAT16 else np.float32)
    shape = tuple(int(info.shape[i]) for i in range(info.rank))
    return IOInfo(ffi.string(info.name).decode(), shape, dtype, int(info.nbytes))


def _weight_files(
    weights: Mapping[str, bytes | bytearray | memoryview | os.PathLike[str]],
) -> tuple[object, list[object]]:
    files = ffi.new("orion_weight_file[]", max(len(weights), 1))
    keep = []
    for i, (key, data) in enumerate(sorted(weights.items())):
        if isinstance(data, (str, os.PathLike)):
            data = read_bytes(data, max_bytes=MAX_WEIGHT_BYTES)   # regular, bounded
        key_c = ffi.new("char[]", key.encode())
        buf = ffi.from_buffer(data)
        keep += [key_c, buf, data]
        files[i].key = key_c
        files[i].data = buf
        files[i].nbytes = len(buf)
    return files, keep


class Program:
    """A compiled program on a backend. Use `Program.compile(...)`."""

    def __init__(self, handle: int) -> None:
        self._handle: int | None = handle
        self._lock = threading.Lock()
        counts = ffi.new("uint32_t[2]")
        check(lib.orion_program_io_count(handle, counts, counts + 1))
        self.inputs = [_io_info(handle, False, i) for i in range(counts[0])]
        self.outputs = [_io_info(handle, True, i) for i in range(counts[1])]
        self.identifier = read_string(lib.orion_program_identifier, handle)
        self.backend = read_string(lib.orion_program_backend, handle)
        self.folder = Path(read_string(lib.orion_program_folder, handle))

    @classmethod
    def compile(
        cls,
        mil_text: str,
        weights: Mapping[str, bytes | bytearray | memoryview | os.PathLike[str]] | None = None,
        backend: str | None = None,
        numerics: str = "fp16",
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Program:
        """Parses, verifies and compiles MIL text with its weight files (key -> blob bytes).

        Spends one compile of the process budget. Returns the program unloaded.
        """
        if numerics not in NUMERICS:
            raise InvalidArgumentError(f"numerics must be one of {sorted(NUMERICS)}, not "
                                       f"{numerics!r}")
        text = mil_text.encode("utf-8")
        files, _keep = _weight_files(weights or {})
        options = ffi.new("orion_compile_options *")
        backend_c = ffi.new("char[]", backend.encode()) if backend else ffi.NULL
        cache_c = ffi.new("char[]", os.fsencode(cache_dir)) if cache_dir else ffi.NULL
        options.backend = backend_c
        options.cache_dir = cache_c
        options.numerics = NUMERICS[numerics]
        out = ffi.new("orion_program *")
        check(lib.orion_program_compile(text, len(text), files, len(weights or {}), options, out))
        return cls(int(out[0]))

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise ReleasedError(f"program {self.identifier} was released")
        return self._handle

    def load(self) -> None:
        check(lib.orion_program_load(self.handle))

    def unload(self) -> None:
        check(lib.orion_program_unload(self.handle))

    @property
    def loaded(self) -> bool:
        out = ffi.new("int *")
        check(lib.orion_program_is_loaded(self.handle, out))
        return bool(out[0])

    def release(self) -> None:
        """Unloads, frees the program and deletes its folder. Idempotent."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            check(lib.orion_program_release(handle))

    def __enter__(self) -> Program:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def prefetch(self) -> None:
        """A hint that this program runs next (`orion_program_prefetch`): on vane an
        idle worker starts reading its first weights while the caller does host work."""
        check(lib.orion_program_prefetch(self.handle))

    def eval(self, inputs: Sequence[Surface], outputs: Sequence[Surface]) -> None:
        """Evaluates on surfaces given in binding order (`self.inputs`, `self.outputs`)."""
        ins = ffi.new("orion_surface[]", [s.handle for s in inputs] or [0])
        outs = ffi.new("orion_surface[]", [s.handle for s in outputs] or [0])
        check(lib.orion_program_eval(self.handle, ins, len(inputs), outs, len(outputs)))

    def surfaces(self) -> tuple[list[Surface], list[Surface]]:
        """Input and output surfaces sized as the device requires: one size per group."""
        in_size = max([MIN_SURFACE_BYTES] + [io.nbytes for io in self.inputs])
        out_size = max([MIN_SURFACE_BYTES] + [io.nbytes for io in self.outputs])
        return (
            [Surface(in_size) for _ in self.inputs],
            [Surface(out_size) for _ in self.outputs],
        )

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Convenience: copies arrays in, evaluates, returns copies of the outputs by name."""
        names = {io.name for io in self.inputs}
        if set(feeds) != names:
            raise InvalidArgumentError(f"inputs are {sorted(names)}, got {sorted(feeds)}")
        if not self.loaded:
            self.load()
        ins, outs = self.surfaces()
        try:
            for io, surface in zip(self.inputs, ins, strict=True):
                arr = np.asarray(feeds[io.name])
                if arr.size != int(np.prod(io.shape)):
                    raise InvalidArgumentError(f"input {io.name} has shape {io.shape}, got "
                                               f"{arr.shape}")
                view = surface.numpy(io.dtype, (arr.size,))
                with surface.cpu_access():
                    view[...] = arr.reshape(-1)
            self.eval(ins, outs)
            pairs = zip(self.outputs, outs, strict=True)
            return {io.name: s.read(io.shape, io.dtype) for io, s in pairs}
        finally:
            for s in ins + outs:
                s.release()

    def weight_path(self, key: str) -> Path:
        """The baked weight file of a key, inside the program folder."""
        return Path(read_string(lib.orion_program_weight_path, self.handle, key.encode()))

    def patch_weight(self, key: str, metadata_offset: int, array: np.ndarray) -> None:
        """Delta path: overwrite one blob entry in place. The program must be unloaded."""
        self.patch_weights(key, {metadata_offset: array})

    def patch_weights(self, key: str, entries: Mapping[int, np.ndarray]) -> None:
        """Overwrite entries (metadata offset -> array) of one weight file, all or none."""
        patches, _keep = _patches(dict(entries))
        check(lib.orion_program_patch_weights(self.handle, key.encode(), patches, len(entries)))

    def update_weights(self, patches: Mapping[str, Mapping[int, np.ndarray]]) -> None:
        """unload -> patch every (key, offset) -> load: no compile is spent on vane; on
        ane the load proves the delta, or recompiles, or refuses (`update_path`)."""
        self.unload()
        for key, entries in patches.items():
            self.patch_weights(key, entries)
        self.load()

    @property
    def update_path(self) -> str:
        """How this program's weight updates go, and why (docs/ane-backend.md)."""
        return read_string(lib.orion_program_update_path, self.handle)

    def hw_time(self) -> HwTime:
        """The device's own time for the last evaluation, where the backend reads one
        (ane with ORION_ANE_PERF_STATS=1)."""
        offered, ns = ffi.new("int *"), ffi.new("uint64_t *")
        why = ffi.new("char[]", 512)
        check(lib.orion_program_hw_time(self.handle, offered, ns, why, 512))
        return HwTime(bool(offered[0]), int(ns[0]), ffi.string(why).decode("utf-8", "replace"))


@dataclass(frozen=True)
class HwTime:
    """`Program.hw_time()`: the device time of the last evaluation, in ns, when
    `offered`; otherwise `why` says why there is none (vane, stats off, a framework
    that offers none)."""

    offered: bool
    ns: int
    why: str


@dataclass(frozen=True)
class UpdateStats:
    """What the backends did about weight updates in this process (ane only)."""

    hidden_compiles: int   # loads that took a compile's time, counted in compile_count()
    canary_probes: int     # first delta updates of a program, probed
    spot_probes: int       # re-probes of proven programs (ORION_ANE_REPROBE)
    probes_failed: int
    demotions: int         # programs moved from the delta path to recompiles


def update_stats() -> UpdateStats:
    out = ffi.new("orion_update_stats *")
    check(lib.orion_update_stats_read(out))
    return UpdateStats(int(out.hidden_compiles), int(out.canary_probes), int(out.spot_probes),
                       int(out.probes_failed), int(out.demotions))


# ---- process-wide state -----------------------------------------------------


BACKEND_NAMES = ("ane", "vane")


def backends() -> list[str]:
    """The backends usable in this process, best first."""
    text = read_string(lib.orion_backends)
    return [name for name in text.split(",") if name]


def resolve_backend(backend: str | None = None) -> str:
    """The backend a new program gets, as the C core chooses it: `backend`; for None or
    "auto", ORION_BACKEND when set, else the best available. A name that is not a
    backend is an error naming where it came from, never carried along silently."""
    name, source = backend, f"backend={backend!r}"
    if name in (None, "", "auto"):
        name, source = os.environ.get("ORION_BACKEND") or "auto", "ORION_BACKEND"
        source = f"ORION_BACKEND={name}" if name != "auto" else "auto"
    if name == "auto":
        found = backends()
        if not found:
            raise BackendUnavailableError("no backend is available: " + describe_backend("vane"))
        return found[0]
    if name not in BACKEND_NAMES:
        raise InvalidArgumentError(
            f"{source}: unknown backend {name!r} (expected one of {', '.join(BACKEND_NAMES)} "
            "or 'auto')")
    if name not in backends():
        raise BackendUnavailableError(f"{source}: {describe_backend(name)}")
    return name


def describe_backend(name: str) -> str:
    return read_string(lib.orion_backend_describe, name.encode())


def compile_count() -> int:
    """Compiles spent by this process (ANE-C31 budget)."""
    return int(lib.orion_compile_count())


def compile_budget() -> int:
    return int(lib.orion_compile_budget())


def set_compile_budget(budget: int) -> None:
    check(lib.orion_set_compile_budget(int(budget)))


def live_programs() -> int:
    return int(lib.orion_program_live_count())


def loaded_programs() -> int:
    return int(lib.orion_program_loaded_count())


def weight_memory_bytes() -> int:
    """Weight bytes held in memory for loaded vane programs, an equal tensor once."""
    return int(lib.orion_weight_memory_bytes())


def set_num_threads(n: int) -> None:
    check(lib.orion_set_num_threads(int(n)))


def num_threads() -> int:
    return int(lib.orion_num_threads())


def vane_isa() -> str:
    return ffi.string(lib.orion_vane_isa()).decode()


def vane_warm(enable: bool) -> None:
    """Turns vane's warm-up on (the default) or off (`orion_vane_warm`)."""
    check(lib.orion_vane_warm(1 if enable else 0))


@dataclass(frozen=True)
class OpTime:
    """Wall time vane spent in one op kind since profiling was turned on."""

    op: str          # MIL spelling
    shape: str       # "gemv" (one live column) or "gemm" for conv / matmul, else ""
    steps: int
    seconds: float


def vane_profile(enable: bool) -> None:
    """Turns vane's per-op-kind step timing on (resetting it) or off."""
    check(lib.orion_vane_profile(1 if enable else 0))


def vane_profile_read() -> list[OpTime]:
    """The per-op-kind times so far, most time first."""
    n = int(lib.orion_vane_profile_read(ffi.NULL, 0))
    rows = ffi.new("orion_vane_op_time[]", max(n, 1))
    n = min(n, int(lib.orion_vane_profile_read(rows, n)))
    out = [OpTime(ffi.string(r.op).decode(), ffi.string(r.shape).decode(), int(r.steps),
                  int(r.ns) / 1e9) for r in rows[0:n]]
    return sorted(out, key=lambda t: -t.seconds)
