"""The safetensors reader: memory-mapped views, bf16 -> fp32 exactly, and every
malformed header, file or value a ModelLoadError naming the file and tensor."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from orion.errors import ModelLoadError
from orion.formats.safetensors import SafetensorsFolder


def _write(path, tensors: dict[str, tuple[str, list[int], bytes]], header_extra=None):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header.update(header_extra or {})
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return path


def _bf16(values) -> bytes:
    bits = np.asarray(values, np.float32).view(np.uint32) >> 16
    return bits.astype(np.uint16).tobytes()


def test_bf16_fp16_fp32_read_exactly_and_mapped(tmp_path):
    vals = np.array([1.0, -2.5, 0.15625, 65280.0], np.float32)   # all exact in bf16
    _write(tmp_path / "model.safetensors", {
        "a": ("BF16", [2, 2], _bf16(vals)),
        "b": ("F16", [4], vals.astype(np.float16).tobytes()),
        "c": ("F32", [4], vals.tobytes())})
    st = SafetensorsFolder(tmp_path)
    for name in "abc":
        st.check_range(name)
        np.testing.assert_array_equal(st.fp32(name).reshape(-1), vals)
    assert isinstance(st.raw("a").base, np.memmap) or st.raw("a").base is not None
    np.testing.assert_array_equal(st.fp32("a", np.array([1])), vals[2:].reshape(1, 2))


def test_rows_read_from_the_file_equal_the_mapped_rows(tmp_path):
    """`read_rows_fp32` (pread, no mapping) gives the rows `fp32` gives, in each dtype,
    for an index array (any order, repeats) and for a slice."""
    vals = np.array([1.0, -2.5, 0.15625, 65280.0, 3.0, -0.5], np.float32)   # bf16-exact
    _write(tmp_path / "model.safetensors", {
        "a": ("BF16", [3, 2], _bf16(vals)),
        "b": ("F16", [3, 2], vals.astype(np.float16).tobytes()),
        "c": ("F32", [3, 2], vals.tobytes())})
    st = SafetensorsFolder(tmp_path)
    for name in "abc":
        for rows in (np.array([2, 0, 2]), slice(1, 3)):
            got = st.read_rows_fp32(name, rows)
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, st.fp32(name, rows))


def test_row_reads_keep_one_descriptor_until_close(tmp_path):
    """A decode step reads embedding rows every token: the file is opened once, not per
    read, and `close` gives the descriptor back (a later read opens it again)."""
    def open_fds() -> int:
        return len(os.listdir("/dev/fd"))

    _write(tmp_path / "model.safetensors",
           {"a": ("F32", [4, 2], np.arange(8, dtype=np.float32).tobytes())})
    st = SafetensorsFolder(tmp_path)
    before = open_fds()
    for i in range(50):
        np.testing.assert_array_equal(st.read_rows_fp32("a", np.array([i % 4])),
                                      [[2 * (i % 4), 2 * (i % 4) + 1]])
    assert open_fds() == before + 1
    st.close()
    assert open_fds() == before
    np.testing.assert_array_equal(st.read_rows_fp32("a", slice(3, 4)), [[6, 7]])
    st.close()
    assert open_fds() == before


def test_rows_past_a_truncated_file_are_refused(tmp_path):
    path = _write(tmp_path / "model.safetensors",
                  {"a": ("F32", [4, 2], np.ones(8, np.float32).tobytes())})
    st = SafetensorsFolder(tmp_path)
    path.write_bytes(path.read_bytes()[:-8])          # cut after the header was read
    with pytest.raises(ModelLoadError, match="tensor a"):
        st.read_rows_fp32("a", np.array([3]))
    with pytest.raises(ValueError, match="slice step of 2"):   # runs only, never every other
        st.read_rows_fp32("a", slice(0, 4, 2))


@pytest.mark.parametrize(("dtype", "value", "what"), [
    ("BF16", 70000.0, "outside fp16"), ("BF16", np.inf, "not finite"),
    ("BF16", np.nan, "not finite"), ("F32", 1e5, "outside fp16"),
    ("F32", np.nan, "not finite"), ("F16", np.inf, "not finite"),
    ("F16", np.nan, "not finite")])
def test_values_the_device_cannot_hold_are_refused_by_tensor_name(tmp_path, dtype, value,
                                                                  what):
    vals = np.array([0.5, value], np.float32)
    data = {"BF16": _bf16, "F32": lambda v: v.tobytes(),
            "F16": lambda v: v.astype(np.float16).tobytes()}[dtype](vals)
    _write(tmp_path / "model.safetensors", {"layer.w": (dtype, [2], data)})
    with pytest.raises(ModelLoadError, match=f"layer.w.*{what}"):
        SafetensorsFolder(tmp_path).check_range("layer.w")


@pytest.mark.parametrize(("tensor", "what"), [
    (("I64", [1], b"\0" * 8), "dtype 'I64'"),
    (("F32", [3], b"\0" * 8), "do not hold shape"),
    (("F32", [-1], b""), "shape"),
    (("F32", "2", b"\0" * 8), "shape")])
def test_bad_header_entries_name_the_tensor(tmp_path, tensor, what):
    _write(tmp_path / "model.safetensors", {"w": tensor})
    with pytest.raises(ModelLoadError, match=f"tensor w: .*{what}"):
        SafetensorsFolder(tmp_path)


def test_offsets_past_the_file_and_truncated_files_are_refused(tmp_path):
    _write(tmp_path / "model.safetensors", {"w": ("F32", [2], b"\0" * 8)},
           {"x": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})
    with pytest.raises(ModelLoadError, match="tensor x: data_offsets"):
        SafetensorsFolder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 30) + b"{}")
    with pytest.raises(ModelLoadError, match="header length"):
        SafetensorsFolder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(ModelLoadError, match="not a JSON object"):
        SafetensorsFolder(tmp_path)


def test_index_shards_must_stay_inside_the_folder(tmp_path):
    outside = tmp_path / "outside.safetensors"
    _write(outside, {"w": ("F32", [1], b"\0" * 4)})
    folder = tmp_path / "model"
    folder.mkdir()
    index = {"weight_map": {"w": "../outside.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="outside"):
        SafetensorsFolder(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": []}))
    with pytest.raises(ModelLoadError, match="weight_map"):
        SafetensorsFolder(folder)


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    for n in (1, 2):
        _write(tmp_path / f"model-0000{n}-of-00002.safetensors", {"w": ("F32", [1], b"\0" * 4)})
    with pytest.raises(ModelLoadError, match="tensor w is also in"):
        SafetensorsFolder(tmp_path)


def test_an_empty_folder_says_what_is_missing(tmp_path):
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        SafetensorsFolder(tmp_path)
