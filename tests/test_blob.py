"""Weight blobs against coremltools' own blob-storage reader and writer."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from orion.errors import BlobFormatError, InvalidArgumentError
from orion.runtime.blob import BlobFile, blob_bytes, patch_blob, read_blob, write_blob

pytestmark = pytest.mark.native

milstorage = pytest.importorskip(
    "coremltools.libmilstoragepython",
    reason="coremltools (the test extra) provides the reference blob reader/writer",
)


def random_arrays(seed: int = 0) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        ("wq", rng.standard_normal((64, 48)).astype(np.float16)),
        ("bias", rng.standard_normal(7).astype(np.float32)),  # odd size: tests padding
        ("gamma", rng.standard_normal(768).astype(np.float16)),
        ("one", np.array([1.0], dtype=np.float16)),
    ]


def reference_write(path: str, arrays: list[tuple[str, np.ndarray]]) -> list[int]:
    writer = milstorage._BlobStorageWriter(path)
    offsets = []
    for _, arr in arrays:
        if arr.dtype == np.float16:
            # the binding takes fp16 as its uint16 bit patterns
            offsets.append(writer.write_fp16_data(arr.reshape(-1).view(np.uint16)))
        else:
            offsets.append(writer.write_float_data(arr.reshape(-1)))
    del writer  # the file is complete once the writer is gone
    return offsets


def test_coremltools_reads_what_we_write(tmp_path):
    arrays = random_arrays()
    path = str(tmp_path / "ours.bin")
    offsets = write_blob(path, arrays)
    reader = milstorage._BlobStorageReader(path)
    for name, arr in arrays:
        if arr.dtype == np.float16:
            got = np.asarray(reader.read_fp16_data(offsets[name])).view(np.float16)
        else:
            got = np.asarray(reader.read_float_data(offsets[name]))
        assert np.array_equal(got, arr.reshape(-1)), name


def test_we_read_what_coremltools_writes(tmp_path):
    arrays = random_arrays(1)
    path = str(tmp_path / "theirs.bin")
    offsets = reference_write(path, arrays)
    entries = read_blob(path)
    assert [offset for offset, _ in entries] == offsets
    for (_, arr), (_, got) in zip(arrays, entries, strict=True):
        assert got.dtype == arr.dtype
        assert np.array_equal(got, arr.reshape(-1))


def test_bytes_are_identical_to_coremltools(tmp_path):
    arrays = random_arrays(2)
    ref = str(tmp_path / "theirs.bin")
    reference_write(ref, arrays)
    ours, _ = blob_bytes(arrays)
    assert ours == open(ref, "rb").read()
    write_blob(tmp_path / "ours.bin", arrays)
    assert (tmp_path / "ours.bin").read_bytes() == ours


def test_single_tensor_offset_is_64_as_mil_expects(tmp_path):
    offsets = write_blob(tmp_path / "w.bin", [("w", np.ones((8, 8), np.float16))])
    assert offsets == {"w": 64}  # ANE-C28: BLOBFILE offset names the metadata header


def test_patch_in_place_keeps_inode_and_other_entries(tmp_path):
    arrays = random_arrays(3)
    path = tmp_path / "w.bin"
    offsets = write_blob(path, arrays)
    inode = os.stat(path).st_ino
    new_wq = np.full((64, 48), 0.5, np.float16)
    patch_blob(path, offsets["wq"], new_wq)
    assert os.stat(path).st_ino == inode  # in place: a mapped file sees it
    reader = milstorage._BlobStorageReader(str(path))
    got = np.asarray(reader.read_fp16_data(offsets["wq"])).view(np.float16)
    assert np.array_equal(got, new_wq.reshape(-1))
    with BlobFile(path) as blob:
        assert np.array_equal(blob.read(offsets["gamma"]), arrays[2][1])
        assert np.array_equal(blob.read(offsets["bias"]), arrays[1][1])


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.zeros((64, 47), np.float16), "entry holds"),  # wrong size
        (np.zeros((64, 48), np.float32)[:, :24], "dtype"),  # wrong dtype
    ],
)
def test_patch_refuses_a_different_size_or_dtype(tmp_path, array, match):
    path = tmp_path / "w.bin"
    offsets = write_blob(path, random_arrays())
    before = path.read_bytes()
    with pytest.raises(InvalidArgumentError, match=match):
        patch_blob(path, offsets["wq"], array)
    assert path.read_bytes() == before


def test_patch_refuses_an_offset_that_is_not_a_header(tmp_path):
    path = tmp_path / "w.bin"
    write_blob(path, random_arrays())
    with pytest.raises(InvalidArgumentError, match="no blob metadata header at offset 128"):
        patch_blob(path, 128, np.zeros((64, 48), np.float16))


def test_write_is_atomic_no_temp_left(tmp_path):
    write_blob(tmp_path / "w.bin", random_arrays())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.bin"]


# ---- malformed files: each gets a clear error --------------------------------


def valid_bytes() -> bytes:
    data, _ = blob_bytes(random_arrays())
    return data


def corrupt(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


MALFORMED = {
    "empty": (b"", "truncated"),
    "short header": (valid_bytes()[:40], "truncated"),
    "bad version": (corrupt(valid_bytes(), 4, "<I", 1), "version 1"),
    "bad magic": (corrupt(valid_bytes(), 64, "<I", 0xCAFEBABE), "bad magic"),
    "too many entries": (corrupt(valid_bytes(), 0, "<I", 1000), "claims 1000 entries"),
    "truncated data": (valid_bytes()[:1000], "run past the end"),
    "data past end": (corrupt(valid_bytes(), 64 + 8, "<Q", 1 << 40), "run past the end"),
    "misaligned data": (corrupt(valid_bytes(), 64 + 16, "<Q", 130), "not 64-byte aligned"),
    "overlapping data": (corrupt(valid_bytes(), 64 + 16, "<Q", 64), "overlaps its metadata"),
    "unknown dtype": (corrupt(valid_bytes(), 64 + 4, "<I", 99), "unknown dtype"),
    "ragged size": (corrupt(valid_bytes(), 64 + 8, "<Q", 3), "whole number"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_blob_is_refused_clearly(tmp_path, case):
    data, match = MALFORMED[case]
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    with pytest.raises(BlobFormatError, match=match):
        BlobFile(path)
    with pytest.raises(BlobFormatError, match=match):
        patch_blob(path, 64, np.zeros((64, 48), np.float16))
    assert path.read_bytes() == data  # a refused patch writes nothing


def test_missing_file_is_an_io_error(tmp_path):
    from orion.errors import IOFailure

    with pytest.raises(IOFailure, match="cannot open"):
        BlobFile(tmp_path / "nope.bin")


def test_unsupported_dtype_is_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="cannot be stored"):
        write_blob(tmp_path / "w.bin", [("x", np.zeros(4, np.float64))])


def test_closed_blob_refuses_reads(tmp_path):
    write_blob(tmp_path / "w.bin", random_arrays())
    blob = BlobFile(tmp_path / "w.bin")
    blob.close()
    with pytest.raises(ValueError, match="closed"):
        blob.entries()


def test_sub_byte_entries_round_trip_and_bad_padding_is_refused(tmp_path):
    """Packed codes keep their bytes and padding bits (coremltools' StorageWriter); a
    header claiming 8 or more padding bits is a format error."""
    from orion.runtime.blob import PackedCodes

    path = tmp_path / "q.bin"
    codes = PackedCodes("uint3", np.arange(5, dtype=np.uint8), 13)    # 39 bits, 1 padding
    offsets = write_blob(path, [("c", codes), ("s", np.ones(3, np.float16))])
    with BlobFile(path) as blob:
        entry = blob.entries()[0]
        assert (entry.nbytes, entry.padding_bits, entry.dtype_code) == (5, 1, codes.code)
    assert read_blob(path)[0][1].tolist() == [0, 1, 2, 3, 4]
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, offsets["c"] + 24, 8)
    path.write_bytes(bytes(data))
    with pytest.raises(BlobFormatError, match="padding bits"):
        BlobFile(path)
