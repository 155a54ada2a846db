"""Weight blob files (the milstorage layout that MIL's BLOBFILE reads).

A blob holds a sequence of tensors; MIL names each by the offset of its
metadata header. The layout is implemented once, in C (csrc/core/blobfile.c);
this module hands numpy arrays across and names the entries.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orion.errors import BlobFormatError, InvalidArgumentError
from orion.runtime._native import check, ffi, lib

# numpy dtype <-> blob dtype code (coremltools BlobDataType)
_CODES: dict[np.dtype, int] = {
    np.dtype(np.float16): lib.ORION_BLOB_FLOAT16,
    np.dtype(np.float32): lib.ORION_BLOB_FLOAT32,
    np.dtype(np.uint8): lib.ORION_BLOB_UINT8,
    np.dtype(np.int8): lib.ORION_BLOB_INT8,
    np.dtype(np.int16): lib.ORION_BLOB_INT16,
    np.dtype(np.uint16): lib.ORION_BLOB_UINT16,
    np.dtype(np.int32): lib.ORION_BLOB_INT32,
    np.dtype(np.uint32): lib.ORION_BLOB_UINT32,
}
_DTYPES: dict[int, np.dtype] = {code: dtype for dtype, code in _CODES.items()}
# sub-byte code dtypes: name -> (blob code, bits)
SUB_BYTE: dict[str, tuple[int, int]] = {
    "int4": (lib.ORION_BLOB_INT4, 4), "uint4": (lib.ORION_BLOB_UINT4, 4),
    "uint1": (lib.ORION_BLOB_UINT1, 1), "uint2": (lib.ORION_BLOB_UINT2, 2),
    "uint3": (lib.ORION_BLOB_UINT3, 3), "uint6": (lib.ORION_BLOB_UINT6, 6)}


@dataclass(frozen=True)
class PackedCodes:
    """A blob entry of sub-byte codes: `count` codes of `dtype` ("uint4", "int4", ...)
    packed least significant bits first into `data` (uint8, ceil(count * bits / 8))."""

    dtype: str
    data: np.ndarray
    count: int

    @property
    def code(self) -> int:
        return SUB_BYTE[self.dtype][0]

    @property
    def padding_bits(self) -> int:
        return self.data.size * 8 - self.count * SUB_BYTE[self.dtype][1]


NamedArrays = Sequence[tuple[str, np.ndarray | PackedCodes]] | dict[str, np.ndarray]


@dataclass(frozen=True)
class BlobEntry:
    """One tensor of a blob file."""

    metadata_offset: int  # what BLOBFILE(offset=...) names
    data_offset: int
    nbytes: int
    dtype_code: int
    padding_bits: int = 0

    @property
    def dtype(self) -> np.dtype | None:
        return _DTYPES.get(self.dtype_code)


def dtype_code(dtype: np.dtype | type) -> int:
    """The blob dtype code of a numpy dtype."""
    dt = np.dtype(dtype)
    if dt not in _CODES:
        raise InvalidArgumentError(f"dtype {dt} cannot be stored in a weight blob")
    return _CODES[dt]


def _pairs(arrays: NamedArrays) -> list[tuple[str, np.ndarray | PackedCodes]]:
    items = list(arrays.items()) if isinstance(arrays, dict) else list(arrays)
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"duplicate tensor names in blob: {names}")
    return [(name, arr if isinstance(arr, PackedCodes) else np.ascontiguousarray(arr))
            for name, arr in items]


def _inputs(arrays: list[tuple[str, np.ndarray | PackedCodes]]) -> tuple[object, list[object]]:
    entries = ffi.new("orion_blob_input[]", max(len(arrays), 1))
    keep = []
    for i, (name, arr) in enumerate(arrays):
        if isinstance(arr, PackedCodes):
            data = np.ascontiguousarray(arr.data, np.uint8)
            entries[i].dtype = arr.code
            entries[i].padding_bits = arr.padding_bits
        else:
            if arr.dtype.byteorder == ">":
                raise InvalidArgumentError(f"tensor {name}: big-endian arrays are not supported")
            data = arr
            entries[i].dtype = dtype_code(arr.dtype)
        ptr = ffi.from_buffer(data)
        keep += [data, ptr]
        entries[i].data = ptr
        entries[i].nbytes = data.nbytes
    return entries, keep


def write_blob(path: str | os.PathLike[str], arrays: NamedArrays) -> dict[str, int]:
    """Writes a blob file atomically; returns each tensor's metadata offset by name."""
    pairs = _pairs(arrays)
    entries, _keep = _inputs(pairs)
    offsets = ffi.new("uint64_t[]", max(len(pairs), 1))
    check(lib.orion_blob_write(os.fsencode(path), entries, len(pairs), offsets))
    return {name: int(offsets[i]) for i, (name, _) in enumerate(pairs)}


def blob_bytes(arrays: NamedArrays) -> tuple[bytearray, dict[str, int]]:
    """The bytes of a blob file in memory, and each tensor's metadata offset."""
    pairs = _pairs(arrays)
    entries, _keep = _inputs(pairs)
    offsets = ffi.new("uint64_t[]", max(len(pairs), 1))
    size = ffi.new("uint64_t *")
    check(lib.orion_blob_encode(entries, len(pairs), ffi.NULL, 0, size, offsets))
    out = bytearray(size[0])
    check(lib.orion_blob_encode(entries, len(pairs), ffi.from_buffer(out), len(out), size, offsets))
    # the bytearray itself, not a bytes copy: a model's head blob is hundreds of MiB
    return out, {name: int(offsets[i]) for i, (name, _) in enumerate(pairs)}


class BlobFile:
    """A validated, read-only view of a blob file. Use as a context manager."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        handle = ffi.new("orion_blob **")
        check(lib.orion_blob_open(os.fsencode(path), handle))
        self._blob = ffi.gc(handle[0], lib.orion_blob_close)

    def close(self) -> None:
        if self._blob is not None:
            ffi.release(self._blob)
            self._blob = None

    def __enter__(self) -> BlobFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> object:
        if self._blob is None:
            raise InvalidArgumentError(f"blob file {self.path} is closed")
        return self._blob

    def entries(self) -> list[BlobEntry]:
        blob = self._open()
        out = []
        entry = ffi.new("orion_blob_entry *")
        for i in range(lib.orion_blob_count(blob)):
            check(lib.orion_blob_entry_at(blob, i, entry))
            out.append(BlobEntry(entry.metadata_offset, entry.data_offset, entry.nbytes,
                                 entry.dtype, entry.padding_bits))
        return out

    def read(self, metadata_offset: int, dtype: np.dtype | type | None = None) -> np.ndarray:
        """A copy of one entry's data as a flat array (of its own dtype by default)."""
        blob = self._open()
        entry = ffi.new("orion_blob_entry *")
        check(lib.orion_blob_find(blob, metadata_offset, entry))
        sub_byte = entry.dtype in {code for code, _ in SUB_BYTE.values()}
        dt = np.dtype(dtype) if dtype is not None else \
            np.dtype(np.uint8) if sub_byte else _DTYPES.get(entry.dtype)
        if dt is None:
            raise BlobFormatError(f"blob entry at {metadata_offset} has dtype code {entry.dtype}")
        if dtype is not None and (sub_byte or dtype_code(dt) != entry.dtype):
            raise BlobFormatError(
                f"blob entry at {metadata_offset} holds dtype code {entry.dtype}, not {dt}"
            )
        out = np.empty(entry.nbytes // dt.itemsize, dtype=dt)
        check(lib.orion_blob_read(blob, metadata_offset, ffi.from_buffer(out), out.nbytes))
        return out


def read_blob(path: str | os.PathLike[str]) -> list[tuple[int, np.ndarray]]:
    """Every entry of a blob file as (metadata offset, array)."""
    with BlobFile(path) as blob:
        return [(e.metadata_offset, blob.read(e.metadata_offset)) for e in blob.entries()]


def _patches(entries: dict[int, np.ndarray]) -> tuple[object, list[object]]:
    patches = ffi.new("orion_blob_patch[]", max(len(entries), 1))
    keep = []
    for i, (offset, array) in enumerate(entries.items()):
        arr = np.ascontiguousarray(array)
        buf = ffi.from_buffer(arr)
        keep += [arr, buf]
        patches[i].metadata_offset = int(offset)
        patches[i].dtype = dtype_code(arr.dtype)
        patches[i].data = buf
        patches[i].nbytes = arr.nbytes
    return patches, keep


def patch_blob(path: str | os.PathLike[str], metadata_offset: int, array: np.ndarray) -> None:
    """Overwrites one entry in place: same dtype, same size, same offset."""
    patch_blob_entries(path, {metadata_offset: array})


def patch_blob_entries(path: str | os.PathLike[str], entries: dict[int, np.ndarray]) -> None:
    """Overwrites several entries in place, validating all before writing any."""
    patches, _keep = _patches(entries)
    check(lib.orion_blob_patch_entries(os.fsencode(path), patches, len(entries)))
