"""Safetensors files: the one reader and writer Orion uses (model folders, adapters,
training checkpoints).

    st = SafetensorsFolder(folder)        # model.safetensors, or the shards that
    st.shape("model.norm.weight")         #   model.safetensors.index.json names
    st.check_range("model.norm.weight")   # finite and within fp16's range
    w = st.fp32("model.norm.weight")      # bf16/fp16/fp32 -> fp32 (or st.fp16: the device's)
    tensors, meta = read_file(path)       # a small file whole, as fp32 (adapters, checkpoints)
    data = save(tensors, "bfloat16", metadata={...})   # bytes, for orion.atomic

The header of each file is parsed here (8-byte length, JSON, data) rather than by
`safetensors.numpy`, which cannot express bf16 in numpy; tensors are numpy views of an
`np.memmap` of the file, so only the pages a caller touches are read. Every name an
index gives goes through `orion.files.inside` (no shard outside the folder), every
file through `check_regular`. Every problem is a `ModelLoadError` naming the file and
the tensor: a bad header (also one nested too deep to parse), offsets outside the file,
tensors whose bytes overlap or leave a hole (the format indexes its buffer exactly, as
the safetensors library checks), a dtype Orion does not read, a value that is not
finite or does not fit fp16 (the device's type: a bf16 weight above 65504 would
silently become inf).

Writing refuses a tensor that is not finite in the dtype written. numpy has no
bfloat16, so `safetensors.numpy.save` cannot write it;
safetensors' own serializer takes each tensor's dtype by name with its raw
little-endian bytes, so bf16 goes through it as rounded uint16 bits, under the dtype
name "bfloat16" (header "BF16").
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import (
    MAX_WEIGHT_BYTES,
    UnsafeFileError,
    check_regular,
    file_identity,
    inside,
    open_regular,
    read_json,
)
from orion.runtime.finite import all_finite

FP16_MAX = 65504.0
MAX_HEADER_BYTES = 100 << 20      # safetensors' own limit
# safetensors dtype -> (numpy storage dtype, bytes); bf16 is stored as its uint16 bits
DTYPES = {"BF16": (np.dtype(np.uint16), 2), "F16": (np.dtype(np.float16), 2),
          "F32": (np.dtype(np.float32), 4), "F64": (np.dtype(np.float64), 8),
          "U32": (np.dtype("<u4"), 4), "U8": (np.dtype(np.uint8), 1)}
# dtypes read only as the codes of a quantized module (orion.models.mlx_weights,
# orion.models.palettized_weights), never as values: check_range refuses them
CODE_DTYPES = ("U32", "U8")
_CHUNK = 1 << 22                   # elements per range-check pass (bounded temporaries)
_BF16_FP16_MAX_BITS = 0x477F       # the largest bf16 magnitude <= 65504 (65280)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int          # byte offset in the file
    nbytes: int


def _read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The tensors a file's header describes, and its `__metadata__` (str -> str)."""
    fd = open_regular(path, max_bytes=1 << 40)
    with open(fd, "rb", closefd=True) as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        head = fh.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise ModelLoadError(f"{path}: not a safetensors file (header length {n} for "
                                 f"a file of {size} bytes)")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ModelLoadError(f"{path}: the safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: the safetensors header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ModelLoadError(f"{path}: __metadata__ is not an object of strings")
    out = {name: _tensor_info(path, name, entry, data_start, data_len)
           for name, entry in header.items()}
    _check_tiling(path, out, data_start, data_len)
    return out, meta


def _check_tiling(path: Path, tensors: dict[str, TensorInfo], data_start: int,
                  data_len: int) -> None:
    """The tensors' byte ranges cover the data exactly once: no two share bytes (one
    tensor written through the other's memory), and no bytes lie between them."""
    at = data_start
    for info in sorted(tensors.values(), key=lambda i: (i.start, i.nbytes)):
        if info.start < at:
            raise ModelLoadError(f"{path}: tensor {info.name}'s bytes overlap another tensor's")
        if info.start > at:
            raise ModelLoadError(f"{path}: {info.start - at} bytes before tensor "
                                 f"{info.name} belong to no tensor")
        at = info.start + info.nbytes
    if at != data_start + data_len:
        raise ModelLoadError(f"{path}: {data_start + data_len - at} bytes after the last "
                             "tensor belong to no tensor")


def _tensor_info(path: Path, name: str, entry: object, data_start: int, data_len: int
                 ) -> TensorInfo:
    def bad(what: str) -> ModelLoadError:
        return ModelLoadError(f"{path}: tensor {name}: {what}")

    if not isinstance(entry, dict):
        raise bad("header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        raise bad(f"dtype {dtype!r} is not one Orion reads ({', '.join(DTYPES)})")
    if not (isinstance(shape, list) and all(isinstance(s, int) and not isinstance(s, bool)
                                            and 0 <= s < 1 << 40 for s in shape)):
        raise bad("shape is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise bad("data_offsets is not [start, end]")
    begin, end = offsets
    count = int(np.prod(shape, dtype=object)) if shape else 1
    if not 0 <= begin <= end <= data_len:
        raise bad(f"data_offsets [{begin}, {end}] fall outside the {data_len} data bytes")
    if end - begin != count * DTYPES[dtype][1]:
        raise bad(f"{end - begin} bytes do not hold shape {shape} of {dtype}")
    return TensorInfo(name, dtype, tuple(shape), path, data_start + begin, end - begin)


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: the shards its index names, model.safetensors,
    or model-*-of-*.safetensors; each checked to be a regular file inside the folder."""
    index = folder / "model.safetensors.index.json"
    try:
        if index.exists():
            data = read_json(inside(folder, index.name))
            wmap = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wmap, dict) or not wmap or not all(
                    isinstance(v, str) for v in wmap.values()):
                raise ModelLoadError(f"{index}: weight_map is not an object of file names")
            names = sorted(set(wmap.values()))
            return [check_regular(inside(folder, n)) for n in names]
        single = folder / "model.safetensors"
        if single.exists():
            return [check_regular(inside(folder, single.name))]
        shards = sorted(folder.glob("model-*-of-*.safetensors"))
        if shards:
            return [check_regular(inside(folder, p.name)) for p in shards]
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    pickled = sorted(p.name for p in [*folder.glob("*.bin"), *folder.glob("*.pt")])
    hint = (f" (found {', '.join(pickled)}: pickle files are never loaded; re-save with "
            "save_pretrained(..., safe_serialization=True))") if pickled else ""
    raise ModelLoadError(f"{folder}: no model.safetensors (nor an index of shards){hint}")


class SafetensorsFolder:
    """Every tensor of a folder's safetensors files, by name (see the module doc)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.files = weight_files(self.folder)
        self.tensors: dict[str, TensorInfo] = {}
        for path in self.files:
            infos, _ = _read_header(path)
            for name, info in infos.items():
                if name in self.tensors:
                    raise ModelLoadError(f"{path}: tensor {name} is also in "
                                         f"{self.tensors[name].file.name}")
                self.tensors[name] = info
        self._maps: dict[Path, np.memmap] = {}
        self._fds: dict[Path, int] = {}     # read_rows_fp32's descriptors, kept open
        self._fds_lock = threading.Lock()

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def fingerprint(self) -> str:
        """A digest of the files as they are now: each one's identity and times (device,
        inode, size, modification and change times in ns; a rewrite, even in place,
        changes the change time) and every tensor's header entry. Reads no tensor."""
        h = hashlib.sha256()
        for path in self.files:
            h.update(file_identity(path).encode())
        for name in sorted(self.tensors):
            i = self.tensors[name]
            h.update(repr((name, i.dtype, i.shape, i.file.name, i.start, i.nbytes)).encode())
        return h.hexdigest()

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    def raw(self, name: str) -> np.ndarray:
        """The tensor as stored: a read-only view of the mapped file (bf16 as uint16)."""
        info = self.tensors[name]
        m = self._maps.get(info.file)
        if m is None:
            m = self._maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="r")
        storage = DTYPES[info.dtype][0]
        return m[info.start: info.start + info.nbytes].view(storage).reshape(info.shape)

    def _chunks(self, name: str) -> Iterator[np.ndarray]:
        """The tensor's stored elements, flat, a chunk at a time, each from a mapping of
        its own that is dropped before the next: a check of every tensor then leaves
        none of the file's pages in the RSS (a view of the shared map would keep every
        page it read until `close`; GPT-2's fp32 file is twice its fp16 budget)."""
        info = self.tensors[name]
        storage, size = DTYPES[info.dtype]
        count = info.nbytes // size
        for i in range(0, count, _CHUNK):
            yield np.memmap(info.file, dtype=storage, mode="r", offset=info.start + i * size,
                            shape=(min(_CHUNK, count - i),))

    def check_range(self, name: str) -> None:
        """Refuses a tensor with a value that is not finite or outside fp16's range."""
        info = self.tensors[name]
        if info.dtype in CODE_DTYPES:
            raise self._bad(name, f"is {info.dtype}: integer codes, not values (a quantized "
                            "module's codes are read only with its config.json quantization "
                            "and its scales)")
        for part in self._chunks(name):
            if info.dtype == "BF16":
                worst = int(np.max(part & 0x7FFF)) if part.size else 0
                if worst >= 0x7F80:
                    raise self._bad(name, "has a value that is not finite")
                if worst > _BF16_FP16_MAX_BITS:
                    raise self._bad(name, "has a value outside fp16's range (|x| > 65504), "
                                    "which the device's fp16 cannot hold")
            elif info.dtype == "F16":   # every finite fp16 value is in range
                if not all_finite(part):
                    raise self._bad(name, "has a value that is not finite")
            elif part.size:
                # max and min carry a NaN or an infinity through, and need no temporary
                # array (np.abs of a chunk would allocate one as large as it)
                hi, lo = float(np.max(part)), float(np.min(part))
                if not (math.isfinite(hi) and math.isfinite(lo)):
                    raise self._bad(name, "has a value that is not finite")
                if max(hi, -lo) > FP16_MAX:
                    raise self._bad(name, "has a value outside fp16's range (|x| > 65504), "
                                    "which the device's fp16 cannot hold")

    def _bad(self, name: str, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.tensors[name].file}: tensor {name} {what}")

    def fp32(self, name: str, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """The tensor (or the given rows of it) as a new fp32 array."""
        a = self.raw(name)
        return _as_fp32(self.tensors[name], a if rows is None else a[rows])

    def _fd(self, path: Path) -> int:
        """A descriptor of `path`, opened (and checked) at its first read, kept until
        `close`: a decode step reads embedding rows every token, and opening the file
        for each read cost two opens a GPT-2 token."""
        with self._fds_lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = open_regular(path, max_bytes=1 << 40)
            return fd

    def read_rows_fp32(self, name: str, rows: np.ndarray | slice) -> np.ndarray:
        """Rows of the tensor as a new fp32 array (see `read_rows`)."""
        return _as_fp32(self.tensors[name], self.read_rows(name, rows))

    def read_rows(self, name: str, rows: np.ndarray | slice) -> np.ndarray:
        """Rows of the tensor as stored (bf16 as uint16), new, read from the file (pread)
        rather than through a mapping: a lookup that runs every decode step (an
        embedding's rows) leaves none of the file's pages mapped, and pays no map and
        unmap."""
        info = self.tensors[name]
        if isinstance(rows, slice) and rows.step not in (None, 1):
            raise InvalidArgumentError(f"read_rows_fp32 reads runs of rows: a slice step of "
                                       f"{rows.step} is not one")
        storage, size = DTYPES[info.dtype]
        row_items = int(np.prod(info.shape[1:]))
        row_bytes = row_items * size
        runs = ([(rows.start or 0, len(range(*rows.indices(info.shape[0]))))]
                if isinstance(rows, slice) else [(int(i), 1) for i in rows])
        out = np.empty((sum(n for _, n in runs), row_items), storage)
        fd = self._fd(info.file)
        at = 0
        for first, n in runs:
            dst = out[at: at + n]
            if os.preadv(fd, [dst], info.start + first * row_bytes) != dst.nbytes:
                raise self._bad(name, "ends before its header says")
            at += n
        return out.reshape((out.shape[0], *info.shape[1:]))

    def fp16(self, name: str, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """The tensor (or the given rows of it) as a new fp16 array, the device's type
        (after `check_range`, every value fits it)."""
        if self.tensors[name].dtype == "BF16":
            return self.fp32(name, rows).astype(np.float16)
        a = self.raw(name)
        return (a if rows is None else a[rows]).astype(np.float16)

    def close(self) -> None:
        """Unmaps the files and closes the descriptors; a later read opens them again."""
        self._maps.clear()
        with self._fds_lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fds", None):    # a folder dropped without close
            self.close()


def _as_fp32(info: TensorInfo, stored: np.ndarray) -> np.ndarray:
    """Stored elements (bf16 as its uint16 bits) as a new fp32 array."""
    if info.dtype == "BF16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32)


def read_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_WEIGHT_BYTES,
              fp16_range: bool = True) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor of one safetensors file as a new fp32 array (a small file: an
    adapter, a checkpoint), and the header's metadata. With `fp16_range` a value
    outside fp16's range is refused as `SafetensorsFolder.check_range` does; every
    value must be finite either way."""
    path = Path(path)
    try:
        check_regular(path, max_bytes=max_bytes)
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    infos, meta = _read_header(path)
    raw = np.memmap(path, np.uint8, "r") if infos else None
    out: dict[str, np.ndarray] = {}
    for name, info in infos.items():
        assert raw is not None
        if info.dtype in CODE_DTYPES:
            raise ModelLoadError(f"{path}: tensor {name} is {info.dtype}: integer codes, not "
                                 "values")
        stored = raw[info.start: info.start + info.nbytes].view(DTYPES[info.dtype][0])
        arr = _as_fp32(info, stored.reshape(info.shape))
        if not all_finite(arr):
            raise ModelLoadError(f"{path}: tensor {name} has a value that is not finite")
        if fp16_range and arr.size and float(np.max(np.abs(arr))) > FP16_MAX:
            raise ModelLoadError(f"{path}: tensor {name} has a value outside fp16's range "
                                 "(|x| > 65504), which the device's fp16 cannot hold")
        out[name] = arr
    return out, meta


def stored_dtypes(path: str | os.PathLike[str]) -> dict[str, str]:
    """Each tensor's dtype as the file stores it ("F32", "BF16", ...)."""
    infos, _ = _read_header(Path(path))
    return {name: info.dtype for name, info in infos.items()}


# ---- writing ----------------------------------------------------------------------

SAVE_DTYPES = ("float32", "float16", "bfloat16")
_STORAGE = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16 (round to nearest, ties to even, as torch's
    .to(torch.bfloat16) does), as their uint16 bit patterns; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16   # uint32 arithmetic
    out = rounded.astype("<u2")
    out[np.isnan(x)] = 0x7FC0
    return out


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` as the little-endian storage array of `dtype` (bf16 as its bits)."""
    if dtype == "bfloat16":
        return bf16_bits(x)
    with np.errstate(over="ignore"):   # past fp16's range becomes inf, which save refuses
        return np.ascontiguousarray(x, _STORAGE[dtype])


def stored_finite(stored: np.ndarray, dtype: str) -> bool:
    """Whether an `encode`d array holds only finite values (bf16 by its exponent bits,
    a chunk at a time: all ones is infinity or NaN)."""
    if dtype != "bfloat16":
        return all_finite(stored)
    bits = stored.reshape(-1)
    return all(int((bits[i:i + _CHUNK] & 0x7F80).max(initial=0)) != 0x7F80
               for i in range(0, bits.size, _CHUNK))


def save(tensors: Mapping[str, np.ndarray], dtype: str,
         metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors file holding every tensor converted to `dtype` (one of SAVE_DTYPES).
    A value that is not finite once converted (NaN, infinity, or an fp32 value past
    fp16's range) is refused: Orion never writes a model, an adapter or a checkpoint
    that would compute NaN."""
    import safetensors

    if dtype not in SAVE_DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {', '.join(SAVE_DTYPES)}, got {dtype!r}")
    arrays = {k: encode(v, dtype) for k, v in tensors.items()}   # kept alive while serializing
    for name, stored in arrays.items():
        if not stored_finite(stored, dtype):
            raise InvalidArgumentError(
                f"tensor {name} holds a value that is not finite in {dtype} (NaN, "
                f"infinity, or past {dtype}'s range); nothing was written")
    spec = getattr(safetensors, "TensorSpec", None)    # safetensors >= 0.8; older: dicts
    flat = {k: (spec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data,
                     data_len=a.nbytes) if spec is not None
                else {"dtype": dtype, "shape": list(a.shape), "data": a.tobytes()})
            for k, a in arrays.items()}
    return bytes(safetensors.serialize(flat, metadata=metadata))


def save_mixed(tensors: Mapping[str, tuple[np.ndarray, str]],
               metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file of tensors in their own dtypes: each (array, dtype) with dtype
    one of SAVE_DTYPES (converted and refused when not finite, as `save`), or "uint32"
    or "uint8" (stored as it is: a quantized module's codes)."""
    import safetensors

    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name, (value, dtype) in tensors.items():
        if dtype in ("uint32", "uint8"):
            arrays[name] = np.ascontiguousarray(value, "<u4" if dtype == "uint32" else "u1")
        elif dtype in SAVE_DTYPES:
            arrays[name] = encode(value, dtype)
            if not stored_finite(arrays[name], dtype):
                raise InvalidArgumentError(f"tensor {name} holds a value that is not finite in "
                                           f"{dtype}; nothing was written")
        else:
            raise InvalidArgumentError(f"tensor {name}: dtype {dtype!r} cannot be written")
        dtypes[name] = dtype
    spec = getattr(safetensors, "TensorSpec", None)    # safetensors >= 0.8; older: dicts
    flat = {k: (spec(dtype=dtypes[k], shape=list(a.shape), data_ptr=a.ctypes.data,
                     data_len=a.nbytes) if spec is not None
                else {"dtype": dtypes[k], "shape": list(a.shape), "data": a.tobytes()})
            for k, a in arrays.items()}
    return bytes(safetensors.serialize(flat, metadata=metadata))
