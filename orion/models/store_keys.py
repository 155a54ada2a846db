"""The program store's key of an inference program: a digest of everything its MIL
text and weight file are made from, so that a later process finds the compiled program
without building its graph (`orion.runtime.Program.open_stored`; the store itself is
the C core's, `csrc/core/store.h`).

    key = store_key(arch, weights.fingerprint(), program_key, tag, extra)

What goes in: the format below, the source of the `orion` package (the graph
builders, the passes and the emitter are all Python), the architecture and its args,
the weights' fingerprint (`WeightSource.fingerprint`: a folder's files by identity and
times, arrays by their bytes), the program's plan entry, the model's tag (its programs'
names) and what else shapes the graph (`extra`: LoRA grids, head chunks). The backend
and numerics do not: a program folder is the same for every backend, and the C core
makes its identifier from them at open.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from orion.models.architecture import Architecture
from orion.models.plan import ProgramKey

FORMAT = "orion-inference-program/1"


@functools.cache
def code_digest() -> str:
    """A digest of every .py file of the `orion` package (read once a process)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def model_digest(arch: Architecture, weights_fingerprint: str) -> str:
    """What every program of a model shares: the architecture, its args, its weights."""
    args = json.dumps(arch.args.to_dict(), sort_keys=True, default=repr)
    text = "\0".join((FORMAT, code_digest(), type(arch).__module__, args, weights_fingerprint))
    return hashlib.sha256(text.encode()).hexdigest()


def store_key(model: str, key: ProgramKey, tag: str, extra: str = "") -> str:
    """The key of one program of the model whose `model_digest` is `model`."""
    return hashlib.sha256("\0".join((model, repr(key), tag, extra)).encode()).hexdigest()
