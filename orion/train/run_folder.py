"""The run folder a trainer writes (`orion train --out DIR`), guarded:

- one trainer at a time: an exclusive lock on `DIR/.orion-train.lock`; a second
  trainer on the same folder is refused (it would interleave log.jsonl and replace
  the first one's checkpoint);
- a folder that holds a run (a checkpoint or a log) is continued only with `resume`
  and restarted only with `overwrite`, which removes the run's own files first;
- temp files that a killed writer left (`.<name>.tmp-<pid>`, pid dead) are removed;
- a folder this trainer created is removed again when the run fails before its
  first checkpoint, so a failed run leaves no empty `--out` behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

from orion.atomic import clean_stale_temps
from orion.errors import OrionError
from orion.train.checkpoint import CHECKPOINT, CheckpointError

LOCK = ".orion-train.lock"
LOG = "log.jsonl"
# what a run writes; `overwrite` removes these and nothing else
RUN_FILES = (CHECKPOINT, LOG, "loss.png", "config.json", "model.safetensors",
             "train.tokens", "train.tokens.json")


class RunFolderError(OrionError, ValueError):
    """The run folder is in use, holds a run that was not to be continued, or is not
    a folder."""


class RunFolder:
    def __init__(self, path: str | os.PathLike[str], *, resume: bool, overwrite: bool,
                 trained_tokenizer: bool) -> None:
        self.path = Path(path)
        self.created = not os.path.lexists(self.path)
        self._fd: int | None = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise RunFolderError(f"--out {self.path}: exists and is not a folder") from None
        self._lock()
        try:
            clean_stale_temps(self.path)
            has_checkpoint = os.path.lexists(self.path / CHECKPOINT)
            has_run = has_checkpoint or os.path.lexists(self.path / LOG)
            if resume and not has_checkpoint:
                raise CheckpointError(f"--resume: no {CHECKPOINT} in {self.path} to resume")
            if has_run and not resume:
                if not overwrite:
                    raise RunFolderError(
                        f"--out {self.path}: holds a run already ({CHECKPOINT} or {LOG}); "
                        "pass --resume to continue it, or --overwrite to start afresh")
                names = RUN_FILES + (("tokenizer.model",) if trained_tokenizer else ())
                for name in names:   # only the run's own files, never the folder
                    if (self.path / name).is_file() or (self.path / name).is_symlink():
                        (self.path / name).unlink()
        except BaseException:
            self.close(failed=True)
            raise

    def _lock(self) -> None:
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunFolderError(f"--out {self.path}: another trainer is using this "
                                     "folder") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def close(self, failed: bool = False) -> None:
        """Releases the lock; `failed`: also removes the folder if this run created it
        (everything in it is then this run's)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if failed and self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            self.created = False
