"""orion.files: the one helper every folder-named file goes through."""

from __future__ import annotations

import os

import pytest

from orion import files
from orion.files import UnsafeFileError


def test_regular_file_is_read(tmp_path):
    (tmp_path / "a.json").write_text('{"x": [1, 2]}')
    assert files.read_json(tmp_path / "a.json") == {"x": [1, 2]}


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="FIFO"):
        files.read_bytes(fifo, max_bytes=100)


def test_device_and_folder_are_refused(tmp_path):
    with pytest.raises(UnsafeFileError, match="character device"):
        files.read_bytes("/dev/zero", max_bytes=100)
    with pytest.raises(UnsafeFileError, match="folder"):
        files.read_bytes(tmp_path, max_bytes=100)


def test_size_bound_is_checked_before_reading(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(UnsafeFileError, match="101 bytes"):
        files.read_bytes(tmp_path / "big", max_bytes=100)


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside", "a/../../outside", ""])
def test_names_outside_the_folder_are_refused(tmp_path, name):
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(UnsafeFileError):
        files.inside(folder, name)


def test_symlink_out_of_the_folder_is_refused_and_inside_is_kept(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret").write_text("root:x:0:0")
    (folder / "real.txt").write_text("ok")
    (folder / "merges.txt").symlink_to(tmp_path / "secret")
    (folder / "alias.txt").symlink_to(folder / "real.txt")
    with pytest.raises(UnsafeFileError) as info:
        files.inside(folder, "merges.txt")
    assert "root:x" not in str(info.value)
    assert files.read_text(files.inside(folder, "alias.txt"), max_bytes=10) == "ok"


def test_hub_snapshot_may_link_into_its_repo_blobs(tmp_path):
    repo = tmp_path / "models--org--name"
    snap = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "blobs" / "f00d").write_text("{}")
    (snap / "config.json").symlink_to(repo / "blobs" / "f00d")
    assert files.read_json(files.inside(snap, "config.json")) == {}


def test_bad_json_names_position_not_content(tmp_path):
    (tmp_path / "c.json").write_text('{"secret-value": }')
    with pytest.raises(UnsafeFileError) as info:
        files.read_json(tmp_path / "c.json")
    assert "line 1" in str(info.value) and "secret-value" not in str(info.value)


def test_deep_nesting_and_bad_utf8_are_typed_errors(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(UnsafeFileError, match="nested"):
        files.read_json(tmp_path / "deep.json")
    (tmp_path / "bad.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(UnsafeFileError, match="UTF-8"):
        files.read_json(tmp_path / "bad.json")
