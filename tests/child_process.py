"""How tests start Orion in another process: with the orion this process imported.

Run from a source checkout, that is the tree (and its build/); in CI it is the
installed package. A child started with `python -m ...` or `-c` puts its working
directory first on sys.path, so a child whose cwd is a checkout would import that
tree instead (without a build, in CI): children run in OUTSIDE.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import orion

ORION_PARENT = Path(orion.__file__).resolve().parents[1]
OUTSIDE = Path(tempfile.gettempdir())


def child_env(**extra: str) -> dict[str, str]:
    """os.environ with this process's orion first on PYTHONPATH, plus `extra`."""
    path = os.pathsep.join(filter(None, [str(ORION_PARENT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}
