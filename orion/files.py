"""The one way Orion opens a file that a user, a model folder or a run folder names.

Policy (docs/security.md):
- a file named *by a folder* (a model folder's config, weights, tokenizer, an index
  that lists shards) must resolve, symlinks followed, inside that folder. A Hugging
  Face hub snapshot (`.../models--org--name/snapshots/<rev>/`) links its files into
  the repo's own `blobs/`, so for such a folder the repo folder is the boundary;
- every file read must be a regular file (not a FIFO, a device, a socket or a
  folder) no larger than the caller's bound, checked on the open descriptor before
  a byte is read, so a FIFO cannot hang a read and /dev/zero cannot fill memory;
- errors name the file and what is wrong, and never quote its contents.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orion.bounded_json import JSONInputError, loads
from orion.errors import OrionError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# Bounds for the kinds of file Orion reads whole; weights are mapped, not read.
MAX_JSON_BYTES = 64 * MIB        # tokenizer.json of a 256K vocabulary is ~20 MB
MAX_TOKENIZER_BYTES = 64 * MIB   # sentencepiece models, BPE vocab/merges files
MAX_TEXT_BYTES = 4 * GIB         # training corpora (read in full by the data step)
MAX_WEIGHT_BYTES = 1 << 40       # 1 TiB: a safetensors shard is mapped, never read whole


class UnsafeFileError(OrionError, ValueError):
    """A file is not a regular file of bounded size, or resolves outside the folder
    that named it."""


def _boundary(folder: Path) -> Path:
    """The folder files may resolve into: the folder itself, or a hub repo folder."""
    real = folder.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def inside(folder: str | os.PathLike[str], name: str | os.PathLike[str]) -> Path:
    """`folder / name`, refused unless it resolves (symlinks followed) inside `folder`.

    `name` may be a relative path a folder's file gave (a shard in an index); an
    absolute name, `..` that climbs out, or a link that points out is refused.
    """
    folder = Path(folder)
    text = os.fspath(name)
    if not text or "\x00" in text:
        raise UnsafeFileError(f"{folder}: an empty or NUL-bearing file name")
    candidate = folder / text
    if Path(text).is_absolute():
        raise UnsafeFileError(f"{folder}: names {text!r}, an absolute path (files a "
                              "folder names must be inside it)")
    resolved = candidate.resolve()
    boundary = _boundary(folder)
    if resolved != boundary and boundary not in resolved.parents:
        raise UnsafeFileError(f"{candidate}: resolves outside {folder} (files a folder "
                              "names must be inside it)")
    return candidate


def open_regular(path: str | os.PathLike[str], *, max_bytes: int) -> int:
    """An O_RDONLY descriptor of `path`, checked to be a regular file of at most
    `max_bytes`. Opened non-blocking (a FIFO must not block the open) and checked
    with fstat on the descriptor itself, so nothing can be swapped in between."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnsafeFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise UnsafeFileError(f"{path}: cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{path}: not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise UnsafeFileError(f"{path}: {info.st_size} bytes, more than the "
                                  f"{max_bytes} this kind of file may have")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: str | os.PathLike[str], *, max_bytes: int = MAX_WEIGHT_BYTES) -> Path:
    """`path`, checked as `open_regular` does, for a library that opens it by name
    (safetensors maps its file itself)."""
    os.close(open_regular(path, max_bytes=max_bytes))
    return Path(path)


def file_identity(path: str | os.PathLike[str]) -> str:
    """A file as it is now, without reading it: its resolved path, device, inode, size,
    and modification and change times in ns (a rewrite, even in place, changes the
    change time). The program store's keys are built on it."""
    st = os.stat(path)
    return repr((str(Path(path).resolve()), st.st_dev, st.st_ino, st.st_size,
                 st.st_mtime_ns, st.st_ctime_ns))


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The whole of a regular file of at most `max_bytes`."""
    fd = open_regular(path, max_bytes=max_bytes)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(size)      # sized by the file, not the bound: read() allocates first
        grew = f.read(1)
    if grew or len(data) > max_bytes:  # it changed while we read
        raise UnsafeFileError(f"{path}: changed size while being read")
    return data


LINE_CHUNK = 1 << 20   # bytes read at a time by iter_lines


def iter_lines(path: str | os.PathLike[str], *, max_bytes: int, max_line_bytes: int
               ) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line of a regular file of at most `max_bytes`,
    split at "\n" only (the one line break JSON Lines has: a raw U+2028 inside a JSON
    string is text, not a break, as `str.splitlines` would have it), without the
    "\n". A line longer than `max_line_bytes` is an UnsafeFileError naming it, raised
    before the rest of it is read: memory stays within the line bound whatever the
    file holds."""
    fd = open_regular(path, max_bytes=max_bytes)
    with os.fdopen(fd, "rb") as f:
        lineno, pending = 1, b""
        while True:
            chunk = f.read(LINE_CHUNK)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if len(line) > max_line_bytes:
                    break
                yield lineno, line
                lineno += 1
            else:
                if len(pending) <= max_line_bytes:
                    continue
            raise UnsafeFileError(f"{path}: line {lineno} is longer than the "
                                  f"{max_line_bytes} bytes a line may have")
        if pending:
            yield lineno, pending


def read_text(path: str | os.PathLike[str], *, max_bytes: int) -> str:
    """A regular file decoded as UTF-8; bad UTF-8 is an error that quotes nothing."""
    data = read_bytes(path, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeFileError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None


def read_json(path: str | os.PathLike[str], *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON file, bounded in size, nesting depth and integer length
    (orion.bounded_json); errors name the file and the position, never the content."""
    text = read_text(path, max_bytes=max_bytes)
    try:
        return loads(text)
    except JSONInputError as exc:
        raise UnsafeFileError(f"{path}: {exc}") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"
