"""A `Program` follows the device's life cycle: compile (weights baked) -> load -> eval
-> unload -> patch weights in place -> load again, without a recompile."""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from orion.errors import InvalidArgumentError, ReleasedError
from orion.files import MAX_WEIGHT_BYTES, open_regular
from orion.runtime._native import check, ffi, lib, read_string
from orion.runtime.blob import _patches
from orion.runtime.surface import MIN_SURFACE_BYTES, Surface

NUMERICS = {"fp16": lib.ORION_NUMERICS_FP16, "strict": lib.ORION_NUMERICS_STRICT}


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


def _mapped(path: str | os.PathLike[str]) -> bytes | mmap.mmap:
    """A weight file, regular and bounded, mapped read-only: a model's blob is hundreds
    of MiB, and a read would hold it in memory beside the program's own copy (its
    pages, clean and shared with the page cache, go with the mapping)."""
    fd = open_regular(path, max_bytes=MAX_WEIGHT_BYTES)
    try:
        if os.fstat(fd).st_size == 0:
            return b""
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def _weight_files(
    weights: Mapping[str, bytes | bytearray | memoryview | os.PathLike[str]],
) -> tuple[object, list[object]]:
    files = ffi.new("orion_weight_file[]", max(len(weights), 1))
    keep = []
    for i, (key, data) in enumerate(sorted(weights.items())):
        if isinstance(data, (str, os.PathLike)):
            data = _mapped(data)
        key_c = ffi.new("char[]", key.encode())
        buf = ffi.from_buffer(data)
        keep += [key_c, buf, data]
        files[i].key = key_c
        files[i].data = buf
        files[i].nbytes = len(buf)
    return files, keep


def _options(backend: str | None, numerics: str, cache_dir: str | os.PathLike[str] | None,
             store_key: str | None) -> tuple[object, list[object]]:
    """orion_compile_options, and what its strings point into (keep it alive)."""
    if numerics not in NUMERICS:
        raise InvalidArgumentError(f"numerics must be one of {sorted(NUMERICS)}, not "
                                   f"{numerics!r}")
    options = ffi.new("orion_compile_options *")
    keep = [ffi.new("char[]", backend.encode()) if backend else ffi.NULL,
            ffi.new("char[]", os.fsencode(cache_dir)) if cache_dir else ffi.NULL,
            ffi.new("char[]", store_key.encode()) if store_key else ffi.NULL]
    options.backend, options.cache_dir, options.store_key = keep
    options.numerics = NUMERICS[numerics]
    return options, keep


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
        store_key: str | None = None,
    ) -> Program:
        """Parses, verifies and compiles MIL text with its weight files (key -> blob bytes).

        Spends one compile of the process budget. Returns the program unloaded. With
        `store_key` (16-128 lower-case hex digits naming everything the program is made
        of) the program is also kept in the program store for `open_stored`.
        """
        text = mil_text.encode("utf-8")
        files, _keep = _weight_files(weights or {})
        options, _opts = _options(backend, numerics, cache_dir, store_key)
        out = ffi.new("orion_program *")
        check(lib.orion_program_compile(text, len(text), files, len(weights or {}), options, out))
        return cls(int(out[0]))

    @classmethod
    def open_stored(
        cls,
        store_key: str,
        backend: str | None = None,
        numerics: str = "fp16",
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Program | None:
        """The program a compile with `store_key` kept in the program store (in this
        process or an earlier one), unloaded; None when the store has none. On vane it
        spends no compile (`orion_program_open_stored`)."""
        options, _opts = _options(backend, numerics, cache_dir, None)
        out = ffi.new("orion_program *")
        found = ffi.new("int *")
        check(lib.orion_program_open_stored(store_key.encode(), options, out, found))
        return cls(int(out[0])) if found[0] else None

    @staticmethod
    def is_stored(store_key: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
        """Whether the program store holds `store_key` (`open_stored` would find it)."""
        options, _opts = _options(None, "fp16", cache_dir, None)
        found = ffi.new("int *")
        check(lib.orion_program_is_stored(store_key.encode(), options, found))
        return bool(found[0])

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

    def set_live_columns(self, columns: int, live: int, first: int = 0) -> None:
        """A hint for the evals that follow (`orion_program_set_live_columns`): of
        the `columns` token columns of the program's convs only the `live` from column
        `first` on matter; vane computes those alone (up to 32 columns) and zeros the
        others. 0, 0: every column."""
        for name, v in (("columns", columns), ("live", live), ("first", first)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32:
                raise InvalidArgumentError(f"live columns: {name} must be an integer in "
                                           f"[0, 2**32), got {v!r}")
        check(lib.orion_program_set_live_columns(self.handle, columns, first, live))

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
