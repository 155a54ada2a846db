"""The cffi declarations of the native core, as the header holds them.

They are the region of `orion.h` between the ORION_CDEF_BEGIN and ORION_CDEF_END
markers. This module imports nothing of Orion's: the build runs it
(`csrc/gen_cffi.py`) before the package exists, to write the parsed declarations as
a module next to the library, and `_native` checks by `cdef_digest` that such a
module was made from the header it reads.
"""

from __future__ import annotations

import hashlib
import re

MODULE_NAME = "_orion_cffi"   # the prebuilt declarations, a file beside the library
DIGEST_NAME = "CDEF_SHA256"   # the variable it records its declarations' digest in

_REGION = re.compile(r"/\* ORION_CDEF_BEGIN \*/(.*)/\* ORION_CDEF_END \*/", re.S)


def cdef_source(header_text: str) -> str:
    """The declarations between the cdef markers, as cffi reads them."""
    match = _REGION.search(header_text)
    if not match:
        raise ValueError("orion.h has no ORION_CDEF_BEGIN/END region")
    return match.group(1)


def cdef_digest(cdef: str) -> str:
    """SHA-256 of the declarations: a prebuilt module serves only the text it was
    made from."""
    return hashlib.sha256(cdef.encode()).hexdigest()
