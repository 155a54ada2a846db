"""Where the tests find real third-party files (tokenizers, corpora): one lookup.

A relative asset name such as "gpt2/encoder.json" or "tokenizers/llama3" is looked
for, in order, in

    tests/data/                 the assets the repository ships (see NOTICE)
    $ORION_TEST_ASSETS/         a folder you point to, laid out like tests/data

A file tests/data ships compressed (`tokenizers/llama3/tokenizer.json.xz`: xz makes
the two 17 and 11 MB tokenizer.json files 3 MB in the repository) is handed out as the
plain file, unpacked once into tests/data/.unpacked/ (ignored by git); a folder that
holds one is handed out as an unpacked copy of the whole folder. A test never sees the
compression.

`require_asset` skips the calling test when the asset is in neither place, naming
the file and the variable, so that a skip says what to fetch and where to put it.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ENV = "ORION_TEST_ASSETS"
REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "tests" / "data"
PACKED = ".xz"
UNPACKED = SHIPPED / ".unpacked"


def asset_roots() -> list[Path]:
    """The folders searched, in order."""
    roots = [SHIPPED]
    if os.environ.get(ENV):
        roots.append(Path(os.environ[ENV]).expanduser())
    return roots


def find_asset(name: str) -> Path | None:
    """The first existing `root / name` (a file or a folder), unpacked where tests/data
    ships it compressed, or None."""
    for root in asset_roots():
        path = root / name
        packed = path.with_name(path.name + PACKED)
        if root == SHIPPED and path.is_dir() and any(
                f.name.endswith(PACKED) for f in path.iterdir()):
            return _unpacked_folder(name)
        if path.exists():
            return path
        if root == SHIPPED and packed.is_file():
            return _unpacked_file(packed, _cache() / name)
    return None


def require_asset(name: str) -> Path:
    """`find_asset(name)`, or a skip that says what is missing and how to supply it."""
    path = find_asset(name)
    if path is None:
        pytest.skip(f"needs the asset {name!r}, which tests/data does not ship: put it "
                    f"under ${ENV}/{name}")
    return path


# ---- unpacking ----------------------------------------------------------------------

_fallback: Path | None = None


def _cache() -> Path:
    """tests/data/.unpacked, or a private temporary folder when the checkout is
    read-only."""
    global _fallback
    try:
        UNPACKED.mkdir(exist_ok=True)
        if os.access(UNPACKED, os.W_OK):
            return UNPACKED
    except OSError:
        pass
    if _fallback is None:
        _fallback = Path(tempfile.mkdtemp(prefix="orion-test-assets-"))
    return _fallback


def _unpacked_folder(name: str) -> Path:
    """A copy of tests/data/NAME with every .xz member unpacked."""
    dest = _cache() / name
    dest.mkdir(parents=True, exist_ok=True)
    for member in sorted((SHIPPED / name).iterdir()):
        if member.name.endswith(PACKED):
            _unpacked_file(member, dest / member.name[:-len(PACKED)])
        elif member.is_file():
            data = member.read_bytes()
            target = dest / member.name
            if not target.is_file() or target.read_bytes() != data:
                _write_atomically(target, data)
    return dest


def _unpacked_file(packed: Path, dest: Path) -> Path:
    """`dest`, the contents of `packed` unpacked; done again only when `packed` changes
    (a stamp beside the cache records the sha256 of what it was unpacked from; not in
    dest's folder, which tests copy whole into model folders)."""
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()
    stamps = _cache() / ".sources"
    stamps.mkdir(exist_ok=True)
    stamp = stamps / hashlib.sha256(str(dest).encode()).hexdigest()[:32]
    if dest.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(packed) as src:
        _write_atomically(dest, src)
    _write_atomically(stamp, digest.encode())
    return dest


def _write_atomically(dest: Path, data: bytes | lzma.LZMAFile) -> None:
    """Whole or not at all, so that two test processes unpacking at once never read a
    half-written file."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        os.chmod(tmp, 0o644)   # as the shipped file (mkstemp makes it 0600)
        with os.fdopen(fd, "wb") as out:
            if isinstance(data, bytes):
                out.write(data)
            else:
                shutil.copyfileobj(data, out, 1 << 20)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
