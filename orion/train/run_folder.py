"""The output folder a command writes, guarded by one rule (`orion train --out`,
`orion lora --adapter-path`, `orion fuse --out`; each names its files in a
`FolderRule`):

- one writer at a time: an exclusive lock (`DIR/.orion-train.lock` for a trainer); a
  second one on the same folder is refused (it would interleave log.jsonl and replace
  the first one's checkpoint);
- a folder that holds a run or a model (any file of the rule's `markers`) is continued
  only with `resume` and restarted only with `overwrite`, which removes the command's
  own files first and nothing else; where the rule is `exclusive` (a model folder
  must not mix two models' files), `overwrite` is refused while the folder holds a
  marker file the command would not write itself;
- temp files that a killed writer left (`.<name>.tmp-<pid>`, pid dead) are removed;
- the folders this writer created are removed again when the run fails before its
  first save (its own files first, then each folder if that left it empty), so a
  failed run leaves no empty `--out` behind and never deletes a file it did not write.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path

from orion.atomic import clean_stale_temps
from orion.errors import OrionError
from orion.train.checkpoint import CHECKPOINT, CheckpointError

LOCK = ".orion-train.lock"
LOG = "log.jsonl"
# what a run writes; `overwrite` removes these and nothing else
RUN_FILES = (CHECKPOINT, LOG, "loss.png", "config.json", "model.safetensors",
             "train.tokens", "train.tokens.json")
_OUR_TEMP = re.compile(rf"^\..+\.tmp-{os.getpid()}$")


class RunFolderError(OrionError, ValueError):
    """The run folder is in use, holds a run that was not to be continued, or is not
    a folder."""


@dataclass(frozen=True)
class FolderRule:
    """What one command's output folder holds.

    option:     the command-line option that names the folder (for messages)
    markers:    file name patterns that mean "holds a run or a model already"
    own_files:  what the command writes: `overwrite` and a failed run remove these only
    resume:     the file `resume` continues from (None: the command cannot resume)
    lock:       the lock file's name (None: no lock)
    keep_lock:  leave the lock file after a run that did not fail (a refused or failed
                run removes a lock file it created either way)
    exclusive:  refuse `overwrite` while a marker file the command does not write is there
    """

    option: str
    markers: tuple[str, ...]
    own_files: tuple[str, ...]
    resume: str | None = None
    lock: str | None = LOCK
    keep_lock: bool = True
    exclusive: bool = False
    holds: str = "a run"


TRAIN = FolderRule("--out", (CHECKPOINT, LOG), RUN_FILES, resume=CHECKPOINT)


class RunFolder:
    def __init__(self, path: str | os.PathLike[str], *, resume: bool, overwrite: bool,
                 trained_tokenizer: bool = False, rule: FolderRule = TRAIN) -> None:
        self.path, self.rule = Path(path), rule
        self.own = rule.own_files + (("tokenizer.model",) if trained_tokenizer else ())
        self.created = _missing_folders(self.path)   # innermost first
        self._fd: int | None = None
        self._made_lock = False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            self.created = []
            raise RunFolderError(f"{rule.option} {self.path}: exists and is not a "
                                 "folder") from None
        try:
            if rule.lock is not None:
                self._lock(rule.lock)
            clean_stale_temps(self.path)
            self._claim(resume, overwrite)
        except BaseException:
            self.close(failed=True)
            raise

    def _claim(self, resume: bool, overwrite: bool) -> None:
        rule = self.rule
        names = sorted(os.listdir(self.path))
        found = [n for n in names if any(fnmatch.fnmatch(n, m) for m in rule.markers)]
        if resume:
            if rule.resume is None:
                raise RunFolderError(f"{rule.option}: this command does not resume")
            if not os.path.lexists(self.path / rule.resume):
                raise CheckpointError(f"--resume: no {rule.resume} in {self.path} to resume")
            return
        if not found:
            return
        if not overwrite:
            again = "pass --resume to continue it, or " if rule.resume else "pass "
            raise RunFolderError(
                f"{rule.option} {self.path}: holds {rule.holds} already "
                f"({', '.join(found[:3])}); {again}--overwrite to start afresh")
        foreign = [n for n in found if n not in self.own]
        if rule.exclusive and foreign:
            raise RunFolderError(
                f"{rule.option} {self.path}: holds {', '.join(foreign[:3])}, which "
                "--overwrite would leave beside the new files (Orion removes only files "
                "it writes); remove them or choose another folder")
        self._remove_own()

    def _remove_own(self) -> None:
        for name in self.own:   # only the command's own files, never the folder
            if (self.path / name).is_file() or (self.path / name).is_symlink():
                (self.path / name).unlink()

    def _lock(self, name: str) -> None:
        self._made_lock = not os.path.lexists(self.path / name)
        fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunFolderError(f"{self.rule.option} {self.path}: another process is "
                                     "writing this folder (another trainer?)") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def close(self, failed: bool = False) -> None:
        """Releases the lock; `failed`: also removes the folders this run created (its
        own files, its lock and temp files first; a folder still holding anything else
        stays). A lock file this run created goes when it failed or the rule does not
        keep it, unlinked while still held (another writer's open then fails to lock)."""
        if self._fd is not None:
            if self._made_lock and (failed or not self.rule.keep_lock):
                assert self.rule.lock is not None
                (self.path / self.rule.lock).unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None
        if not (failed and self.created):
            return
        try:
            self._remove_own()
            for entry in os.scandir(self.path):
                if entry.name == self.rule.lock or _OUR_TEMP.match(entry.name):
                    Path(entry.path).unlink(missing_ok=True)
        except FileNotFoundError:   # someone removed it already
            pass
        for folder in self.created:
            try:
                folder.rmdir()
            except OSError:   # not empty: something not ours is in it
                break
        self.created = []


def _missing_folders(path: Path) -> list[Path]:
    """The folders `path.mkdir(parents=True)` would create, innermost first."""
    out = []
    while not os.path.lexists(path) and path != path.parent:
        out.append(path)
        path = path.parent
    return out
