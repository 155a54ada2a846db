"""How to install an optional extra, in words that work where the user is.

`pip install 'orion-ane[serve]'` works only where a package index carries orion-ane;
from a checkout `pip install '.[serve]'` does, and the extra's packages by name work
anywhere. The installed package's metadata lists them, so a hint cannot drift from
pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import sys

from orion.errors import MissingExtraError

DISTRIBUTION = "orion-ane"


def extra_packages(extra: str) -> list[str]:
    """The requirements of `extra` on this platform, as the installed metadata lists
    them ([] when Orion runs uninstalled from a source tree)."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        if f'extra == "{extra}"' not in marker:
            continue
        platform = re.search(r'sys_platform == "(\w+)"', marker)
        if platform and platform.group(1) != sys.platform:
            continue
        out.append(spec.strip())
    return out


def install_hint(extra: str) -> str:
    """One line: the commands that install `extra`."""
    packages = extra_packages(extra)
    by_name = (f", or pip install {' '.join(shlex.quote(p) for p in packages)}"
               if packages else "")
    return (f"install the {extra} extra: pip install '.[{extra}]' from an Orion checkout"
            f"{by_name} (pip install '{DISTRIBUTION}[{extra}]' only where a package index "
            f"carries {DISTRIBUTION})")


def missing_extra(extra: str, what: str, exc: ImportError) -> MissingExtraError:
    """The error for `what` needing `extra`, whose import of `exc.name` failed."""
    missing = exc.name or "a module"
    return MissingExtraError(f"{what} needs {missing}, which is not installed; "
                             f"{install_hint(extra)}")
