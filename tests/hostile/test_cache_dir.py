"""Class 3: the program cache. Orion creates its cache directory with mode 0700 and
refuses one that is a symlink, not a directory, another user's or writable by others;
the pruner deletes only program folders that carry Orion's marker, in process
directories of dead processes, and never what it did not create."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orion.errors import IOFailure
from orion.runtime import Program

DEAD_PID = 999_999_999   # above any pid_max, so never a live process
T = "tensor<fp16, [1, 768, 1, 32]>"
MIL = ("program(1.3)\n{\n"
       f"    func main<ios18>({T} in_a, {T} in_b) {{\n"
       f'        {T} out_s = add(x = in_a, y = in_b)[name = string("out_s")];\n'
       "    } -> (out_s);\n}\n")


def _compile(cache: Path | None) -> None:
    with Program.compile(MIL, cache_dir=cache) as p:
        assert p.folder.exists()
        assert (p.folder / ".orion-program").is_file()   # the marker the pruner looks for


def test_a_symlinked_cache_dir_is_refused(tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(real)
    with pytest.raises(IOFailure, match="symbolic link"):
        _compile(tmp_path / "cache")
    assert list(real.iterdir()) == []


def test_the_default_cache_is_created_0700_and_a_planted_link_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("ORION_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    _compile(None)
    cache = tmp_path / f"orion-{os.getuid()}"
    info = cache.lstat()
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()
    # another user plants $TMPDIR/orion-<uid> as a link before Orion ever runs
    planted = tmp_path / "t2"
    planted.mkdir()
    victim = tmp_path / "victim"
    (victim / f"p{DEAD_PID}" / "data").mkdir(parents=True)
    (planted / f"orion-{os.getuid()}").symlink_to(victim)
    monkeypatch.setenv("TMPDIR", str(planted))
    with pytest.raises(IOFailure, match="symbolic link"):
        _compile(None)
    assert (victim / f"p{DEAD_PID}" / "data").is_dir()   # nothing deleted through the link


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o722])
def test_a_cache_dir_others_can_write_is_refused(tmp_path, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(mode)
    with pytest.raises(IOFailure, match="writable by other users"):
        _compile(cache)


def test_a_cache_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "cache").write_text("x")
    with pytest.raises(IOFailure):
        _compile(tmp_path / "cache")


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="needs root to give a folder to another uid; runs in CI (as root)")
def test_another_users_cache_dir_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 12345, 12345)
    with pytest.raises(IOFailure, match="owned by uid 12345"):
        _compile(cache)


def test_the_pruner_keeps_what_orion_did_not_create(tmp_path):
    """The probe's case: a user's ~/work/p123 beside a dead pid went, recursively."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    user = cache / f"p{DEAD_PID}"                        # named like ours, not ours
    (user / "thesis").mkdir(parents=True)
    (user / "thesis" / "chapter1.tex").write_text("years of work")
    (user / "notes.txt").write_text("keep me")
    ours = cache / f"p{DEAD_PID - 1}" / "0123abcd"        # a dead process's program folder
    (ours / "weights").mkdir(parents=True)
    (ours / "weights" / "w.bin").write_bytes(b"\0" * 64)
    (ours / ".orion-program").write_text("")
    mixed = cache / f"p{DEAD_PID - 2}"                    # ours and the user's side by side
    (mixed / "prog").mkdir(parents=True)
    (mixed / "prog" / ".orion-program").write_text("")
    (mixed / "user-folder").mkdir()
    (mixed / "user-folder" / "f").write_text("keep")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    linked = cache / f"p{DEAD_PID - 3}"
    linked.symlink_to(outside)                            # a link named like ours
    _compile(cache)
    assert (user / "thesis" / "chapter1.tex").read_text() == "years of work"
    assert (user / "notes.txt").exists()
    assert not (cache / f"p{DEAD_PID - 1}").exists()     # ours, marked: pruned
    assert not (mixed / "prog").exists() and (mixed / "user-folder" / "f").exists()
    assert (outside / "precious").exists() and linked.is_symlink()


def test_a_live_process_directory_is_left_alone(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    live = cache / "p1" / "prog"   # pid 1 is alive
    live.mkdir(parents=True)
    (live / ".orion-program").write_text("")
    _compile(cache)
    assert live.exists()


def test_the_program_store_opens_and_removes_only_its_own_entries(tmp_path, monkeypatch):
    """A link planted in the store is not an entry: never opened, never removed (nor
    what it points to), even when the bound removes every entry."""
    cache = tmp_path / "cache"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / ".orion-program").write_text("")
    (victim / "model.mil").write_text(MIL)
    store = cache / "store"
    store.mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    (store / ("a" * 64)).symlink_to(victim)
    assert Program.open_stored("a" * 64, cache_dir=cache) is None
    monkeypatch.setenv("ORION_CACHE_MAX_BYTES", "1")   # every entry is over the bound
    Program.compile(MIL, cache_dir=cache, store_key="b" * 64).release()
    assert sorted(p.name for p in store.iterdir()) == ["a" * 64]
    assert sorted(p.name for p in victim.iterdir()) == [".orion-program", "model.mil"]


def test_a_linked_program_store_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (cache / "store").symlink_to(elsewhere)
    with pytest.raises(IOFailure, match="program store"):
        Program.open_stored("c" * 64, cache_dir=cache)
    Program.compile(MIL, cache_dir=cache, store_key="c" * 64).release()   # compiles, keeps none
    assert list(elsewhere.iterdir()) == []
