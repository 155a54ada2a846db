"""Crash-safe file replacement: write a temp file beside the target, fsync it, rename
it over the target, fsync the folder. A reader (or a kill -9 at any instant) sees the
old file or the new one, never a torn mix."""

from __future__ import annotations

import os
import re
from pathlib import Path

# `.<name>.tmp-<pid>`: the temp file atomic_write_bytes writes beside its target
_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>[0-9]+)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive, and not ours to judge
        return True
    return True


def clean_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Removes temp files of `atomic_write_bytes` left in `folder` by a writer that was
    killed (kill -9): only names of our pattern, only plain files, only when the pid
    in the name is not a live process. Returns what it removed."""
    removed = []
    for entry in os.scandir(folder):
        m = _TEMP.match(entry.name)
        if not m or not entry.is_file(follow_symlinks=False) or _alive(int(m["pid"])):
            continue
        Path(entry.path).unlink(missing_ok=True)
        removed.append(Path(entry.path))
    return removed


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | memoryview) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)   # our pid's name: a leftover there is ours
    try:
        # O_EXCL + O_NOFOLLOW: never write through a link or FIFO planted at the name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
