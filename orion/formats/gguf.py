"""GGUF files (llama.cpp's model format), read here rather than by gguf-py so that every
length and offset a file states is checked before it is used.

    f = GGUFFile("model.gguf")
    f.metadata["general.architecture"]     # "llama", "qwen3", "gpt2", ...
    f.tensors["blk.0.attn_q.weight"]       # its GGML type, shape (numpy order), bytes
    f.raw("blk.0.attn_q.weight")           # the stored bytes (a view of the mapped file)
    f.read_rows("token_embd.weight", ids)  # those stored rows, read (not mapped)
    f.raw_chunks("blk.0.attn_q.weight")    # all of them, read a run of rows at a time

Layout (version 2 and 3, little-endian): "GGUF", u32 version, u64 tensor count, u64
key-value count; the key-values (a u64-length string key, a u32 value type, the value;
arrays as u32 element type, u64 count, the elements); the tensor headers (name, u32
dimension count, u64 dimensions innermost first, u32 type, u64 offset from the data);
the data, starting at the next multiple of `general.alignment` (32 unless stated).

Every problem is a `ModelLoadError` naming the file and what is wrong: a truncated
file, counts or strings larger than the file can hold, a dimension of zero or one past
2^40, a row that is not whole blocks, data that lies outside the file or overlaps
other data, names given twice, and unsupported tensor types (by name).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import ModelLoadError
from orion.files import MAX_WEIGHT_BYTES, UnsafeFileError, file_identity, open_regular
from orion.formats.gguf_quants import GGMLType, ggml_type, row_bytes

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_COUNT = 1 << 20          # tensors, keys, and elements of one array
MAX_STRING = 1 << 24         # bytes of one string (a chat template is a few KiB)
MAX_DIMS = 4
MAX_DIM = 1 << 40
MAX_NAME = 256
# value types: (struct code, bytes) for the fixed-size ones
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
            5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
            12: ("<d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
          10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]   # numpy order: the last axis is the stored row
    start: int               # absolute byte offset in the file
    nbytes: int


class _Cursor:
    """Reads the header's fields in order, each checked to lie inside the file."""

    def __init__(self, data: np.ndarray, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.at + n > self.data.size:
            raise self.fail(f"truncated: {what} at byte {self.at} runs past the end of the "
                            f"file ({self.data.size} bytes)")
        out = self.data[self.at: self.at + n].tobytes()
        self.at += n
        return out

    def scalar(self, code: int, what: str) -> Any:
        fmt, n = _SCALARS[code]
        return struct.unpack(fmt, self.take(n, what))[0]

    def u32(self, what: str) -> int:
        return int(self.scalar(4, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(10, what))

    def string(self, what: str, limit: int = MAX_STRING) -> str:
        n = self.u64(f"the length of {what}")
        if n > limit:
            raise self.fail(f"{what} claims {n} bytes (at most {limit})")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY and depth == 0:
            etype = self.u32(f"the element type of {what}")
            count = self.u64(f"the length of {what}")
            if count > MAX_COUNT or count > self.data.size - self.at:
                raise self.fail(f"{what} claims {count} elements, more than the file holds")
            if etype in _NUMPY:    # numbers in one read
                size = np.dtype(_NUMPY[etype]).itemsize
                raw = self.take(count * size, what)
                return np.frombuffer(raw, _NUMPY[etype]).tolist()
            if etype == STRING:
                return [self.string(f"{what}[{i}]") for i in range(count)]
            raise self.fail(f"{what} has element type {etype}, not one GGUF defines")
        raise self.fail(f"{what} has value type {vtype}, not one GGUF defines")


class GGUFFile:
    """A GGUF file's metadata and tensor headers, checked whole at open; tensors are
    views of a read-only mapping (see the module docstring), or read through the
    descriptor opened then."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd_lock = threading.Lock()
        # kept for read_rows until close: an open a read cost a decode step 0.1 ms (an
        # embedding row), and every read is of the file that was checked here
        self._fd: int | None = self._open()
        try:
            self._read_header()
        except BaseException:
            self.close()      # a refused file keeps no descriptor until collected
            raise

    def _read_header(self) -> None:
        self._map: np.memmap | None = np.memmap(self.path, np.uint8, "r") \
            if self.path.stat().st_size else None
        data = self._map if self._map is not None else np.zeros(0, np.uint8)
        c = _Cursor(data, self.path)
        if c.take(4, "the magic") != MAGIC:
            raise c.fail("not a GGUF file (it does not start with \"GGUF\")")
        self.version = c.u32("the version")
        if self.version not in VERSIONS:
            raise c.fail(f"GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = c.u64("the tensor count"), c.u64("the key count")
        for n, what in ((n_tensors, "tensors"), (n_kv, "keys")):
            if n > MAX_COUNT or n > data.size:
                raise c.fail(f"the header claims {n} {what}, more than the file can hold")
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = c.string(f"key {i}", MAX_NAME)
            if key in self.metadata:
                raise c.fail(f"key {key!r} is given twice")
            self.metadata[key] = c.value(c.u32(f"the type of {key}"), key)
        headers = [self._tensor_header(c, i) for i in range(n_tensors)]
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or isinstance(align, bool) or not 1 <= align <= 1 << 16 \
                or align & (align - 1):
            raise c.fail(f"general.alignment {align!r} is not a power of two up to 65536")
        data_start = -(-c.at // align) * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, gtype, shape, offset in headers:
            if name in self.tensors:
                raise c.fail(f"tensor {name} is given twice")
            nbytes = row_bytes(gtype, shape[-1], f"{self.path}: tensor {name}") * \
                int(np.prod(shape[:-1], dtype=object))
            if offset % align:
                raise c.fail(f"tensor {name}: offset {offset} is not a multiple of the "
                             f"alignment {align}")
            start = data_start + offset
            if start + nbytes > data.size:
                raise c.fail(f"tensor {name}: {nbytes} bytes at offset {start} run past the "
                             f"end of the file ({data.size} bytes)")
            self.tensors[name] = GGUFTensor(name, gtype, shape, start, nbytes)
        at = data_start
        for t in sorted(self.tensors.values(), key=lambda t: t.start):
            if t.start < at:
                raise c.fail(f"tensor {t.name}'s bytes overlap another tensor's")
            at = t.start + t.nbytes

    @staticmethod
    def _tensor_header(c: _Cursor, i: int) -> tuple[str, GGMLType, tuple[int, ...], int]:
        name = c.string(f"the name of tensor {i}", MAX_NAME)
        n_dims = c.u32(f"the dimension count of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = [c.u64(f"a dimension of {name}") for _ in range(n_dims)]
        if any(not 1 <= d <= MAX_DIM for d in dims) or int(np.prod(dims, dtype=object)) \
                > MAX_DIM:
            raise c.fail(f"tensor {name} has dimensions {dims}: each must be 1 to 2^40, "
                         "and so must their product")
        gtype = ggml_type(c.u32(f"the type of {name}"), f"{c.path}: tensor {name}")
        offset = c.u64(f"the offset of {name}")
        return name, gtype, tuple(reversed(dims)), offset

    def _open(self) -> int:
        try:
            return open_regular(self.path, max_bytes=MAX_WEIGHT_BYTES)
        except UnsafeFileError as exc:
            raise ModelLoadError(str(exc)) from None

    def fingerprint(self) -> str:
        """A digest of the file as it is now (`orion.files.file_identity`) and of every
        tensor's header. Reads no tensor."""
        h = hashlib.sha256(file_identity(self.path).encode())
        for name in sorted(self.tensors):
            t = self.tensors[name]
            h.update(repr((name, t.type.code, t.shape, t.start, t.nbytes)).encode())
        return h.hexdigest()

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of a tensor [rows..., row bytes] (a read-only view)."""
        if self._map is None:
            self._map = np.memmap(self.path, np.uint8, "r")
        t = self.tensors[name]
        return self._map[t.start: t.start + t.nbytes].reshape(*t.shape[:-1], -1)

    def raw_chunks(self, name: str, max_bytes: int = 8 << 20) -> Iterator[np.ndarray]:
        """A tensor's stored bytes as `raw` shapes them, a run of whole rows at a time,
        each read by `read_rows` (not mapped): a pass over every tensor this way leaves
        no page of the file resident (a mapped pass made the whole file count in the
        process's RSS at load)."""
        t = self.tensors[name]
        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        per = max(1, max_bytes // (t.nbytes // rows))
        for lo in range(0, rows, per):
            data = self.read_rows(name, np.arange(lo, min(lo + per, rows)))
            yield data if len(t.shape) > 1 else data.reshape(-1)

    def read_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Stored rows `rows` of a tensor [len(rows), row bytes], read from the file
        (preadv, one call a run of consecutive rows) rather than through the mapping: an
        embedding's lookups at every step left tens of MiB of the file resident there
        (the kernel maps the pages around each one it faults in)."""
        t = self.tensors[name]
        n_rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        row_bytes = t.nbytes // n_rows
        rows = np.asarray(rows, np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
            raise ModelLoadError(f"{self.path}: tensor {name} has {n_rows} rows; rows "
                                 f"{int(rows.min())} to {int(rows.max())} were asked for")
        out = np.empty((rows.size, row_bytes), np.uint8)
        if not rows.size:
            return out
        if rows.size == 1:      # a decode step's row: np.diff and flatnonzero on cold
            runs = [(0, 1)]     # caches cost a GPT-2 token 0.035 ms of its two reads
        else:
            breaks = (np.flatnonzero(np.diff(rows) != 1) + 1).tolist()
            runs = list(zip([0, *breaks], [*breaks, rows.size], strict=True))
        with self._fd_lock:     # close() cannot take the descriptor from under a read
            if self._fd is None:
                self._fd = self._open()
            for lo, hi in runs:
                dst = out[lo:hi]
                if os.preadv(self._fd, [dst], t.start + int(rows[lo]) * row_bytes) != dst.nbytes:
                    raise ModelLoadError(f"{self.path}: the file ends inside {name}")
        return out

    def string(self, key: str, default: str | None = None) -> str | None:
        v = self.metadata.get(key, default)
        if v is not None and not isinstance(v, str):
            raise ModelLoadError(f"{self.path}: {key} is not a string")
        return v

    def forget_lists(self, prefix: str) -> None:
        """Drops the list values of the keys under `prefix`: a vocabulary's tokens and
        merges, once a tokenizer holds them (30 MiB of Python strings for Qwen's 151,936
        tokens, held for as long as the weights)."""
        for key in [k for k, v in self.metadata.items()
                    if k.startswith(prefix) and isinstance(v, list)]:
            del self.metadata[key]

    def close(self) -> None:
        """Drops the mapping and closes the descriptor (a later `raw` maps the file
        again, a later `read_rows` opens it again)."""
        self._map = None
        with self._fd_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:    # a file dropped without close
            self.close()
