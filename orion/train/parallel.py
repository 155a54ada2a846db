"""Data parallelism as one object a trainer calls at a few points, so every trainer
(full training today, LoRA later) gets it by construction:

    out_dir(out)      rank 0 writes into `out`; the other ranks into a scratch folder
                      of their own, removed by `close` (they write nothing of the run's)
    check_same(parts) at start: refuse ranks whose config, code or data differ
    checkpoint(load)  on resume rank 0 reads the checkpoint and sends it to the others
    share(...)        after a step's micro-batches: every rank's losses and flags
    sum_grads(grads)  the weight gradients summed over the ranks, in place
    fail()            from a rank whose step raised: tells the others, which stop too

Alone (not launched by mlx.launch) every call is a no-op and mlx is never imported.
Each rank draws its own shard of each global batch (`Batches(rank=, world=)`): with N
ranks and `grad_accum` A the global batch is N*A micro-batches, drawn in the order a
single process with `grad_accum` N*A draws them, and rank r computes those of index
k*N + r. The sum of the ranks' gradients is thus that process's sum, in another order
(in the same one for 2 ranks x grad_accum 1: g0 + g1, so there the runs agree bit for bit).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError
from orion.train.checkpoint import Checkpoint
from orion.train.distributed import REDUCE_DTYPES, DistributedError, Group, init, launched
from orion.train.distributed import check_same as _check_same

# share()'s per-rank record: failed, non-finite, overflow, number of losses, losses...
_FAILED, _NONFINITE, _OVERFLOW, _COUNT, _LOSSES = 0, 1, 2, 3, 4


@dataclass
class Shared:
    """What every rank knows after `share`: the same values on each."""

    losses: list[float]         # every micro-batch loss of the global batch, in draw order
    overflow: bool              # an fp16 overflow on any rank
    skipped: str | None         # why the step is skipped, if any rank says so


class DataParallel:
    def __init__(self, group: Group | None = None, reduce_dtype: str = "float32") -> None:
        if reduce_dtype not in REDUCE_DTYPES:
            raise InvalidArgumentError(f"reduce_dtype must be one of {REDUCE_DTYPES}, "
                                       f"not {reduce_dtype!r}")
        self.group, self.reduce_dtype = group, reduce_dtype
        self.rank = group.rank if group else 0
        self.size = group.size if group else 1
        self.reduce_ms = 0.0        # of the last step: share + sum_grads
        self.reduce_bytes = 0       # sent into the last step's all-reduce by this rank
        self._scratch: Path | None = None

    @classmethod
    def from_env(cls, timeout_s: float, reduce_dtype: str = "float32") -> DataParallel:
        """Alone unless this process is a rank started by mlx.launch."""
        return cls(init(timeout_s) if launched() else None, reduce_dtype)

    @property
    def writes(self) -> bool:
        """Only rank 0 writes checkpoints, logs, the plot and the exported model."""
        return self.rank == 0

    def out_dir(self, out: Path) -> Path:
        if self.writes:
            return out
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=f"orion-rank{self.rank}-"))
            # removed by close, or at exit when a failed start never reaches close
            self._remove_scratch = weakref.finalize(self, shutil.rmtree, self._scratch, True)
        return self._scratch

    def close(self) -> None:
        if self._scratch is not None:
            self._remove_scratch()
            self._scratch = None

    # ---- start -------------------------------------------------------------------------

    def check_same(self, parts: Mapping[str, Any]) -> None:
        if self.group is not None:
            _check_same(self.group, parts)

    def checkpoint(self, load: Callable[[], Checkpoint]) -> Checkpoint:
        """Rank 0's `load()`, on every rank (the others may not see rank 0's files)."""
        g = self.group
        if g is None:
            return load()
        ck = load() if self.rank == 0 else None
        tensors = {**ck.weights, **ck.optim} if ck else {}
        header = {"meta": ck.meta, "optim": sorted(ck.optim),
                  "tensors": [[k, list(v.shape)] for k, v in tensors.items()]} if ck else None
        doc = json.loads(g.broadcast_bytes(
            json.dumps(header).encode() if header else None, "receiving the checkpoint"))
        # the bits as uint32, rank 0's plus zeros: 0 + x = x exactly, even for -0.0
        bits = {k: (np.ascontiguousarray(tensors[k], np.float32).view(np.uint32).copy()
                    if ck else np.zeros(shape, np.uint32)) for k, shape in doc["tensors"]}
        g.all_sum_into(list(bits.values()), "receiving the checkpoint's tensors")
        weights, optim = {}, {}
        for k, b in bits.items():
            (optim if k in doc["optim"] else weights)[k] = b.view(np.float32)
        return Checkpoint(weights, optim, doc["meta"])

    # ---- each step ---------------------------------------------------------------------

    def _gather(self, record: np.ndarray) -> np.ndarray:
        assert self.group is not None
        return self.group.all_gather(record, "sharing the step's losses and flags")

    def share(self, losses: list[float], overflow: bool, skipped: str | None,
              grad_accum: int) -> Shared:
        """Every rank's losses and flags, after its micro-batches of a step."""
        self.reduce_ms, self.reduce_bytes = 0.0, 0
        if self.group is None:
            return Shared(losses, overflow, skipped)
        t0 = time.perf_counter()
        rec = np.full(_LOSSES + grad_accum, np.nan)
        rec[[_FAILED, _NONFINITE, _OVERFLOW, _COUNT]] = (0, skipped is not None, overflow,
                                                         len(losses))
        rec[_LOSSES:_LOSSES + len(losses)] = losses
        every = self._gather(rec)
        self.reduce_ms = (time.perf_counter() - t0) * 1e3
        failed = [r for r in range(self.size) if every[r, _FAILED]]
        if failed:
            raise DistributedError(f"rank {self.rank}: rank {', '.join(map(str, failed))} "
                                   "failed during the step (its own output says why); stopping")
        counts = every[:, _COUNT].astype(int)
        merged = [float(every[r, _LOSSES + k]) for k in range(grad_accum)
                  for r in range(self.size) if k < counts[r]]
        bad = [r for r in range(self.size) if every[r, _NONFINITE]]
        if skipped is None and bad:
            skipped = f"non-finite loss on rank {bad[0]}"
        return Shared(merged, bool(every[:, _OVERFLOW].any()), skipped)

    def fail(self, grad_accum: int) -> None:
        """Called by a rank whose step raised, in place of `share`: the other ranks
        learn it there and stop with an error naming this rank."""
        if self.group is None:
            return
        rec = np.full(_LOSSES + grad_accum, np.nan)
        rec[_FAILED] = 1
        try:
            self._gather(rec)
        except DistributedError:
            pass        # the peers are gone already; the caller's own error says why

    def sum_grads(self, grads: dict[str, np.ndarray]) -> None:
        """Each gradient replaced in place by its sum over the ranks (in `reduce_dtype`
        on the wire); every rank gets the same bits."""
        if self.group is None:
            return
        t0 = time.perf_counter()
        arrays = [grads[k] for k in sorted(grads)]      # the same order on every rank
        self.group.all_sum_into(arrays, "the gradient all-reduce", self.reduce_dtype)
        self.reduce_bytes = sum(a.size for a in arrays) * (
            4 if self.reduce_dtype == "float32" else 2)
        self.reduce_ms += (time.perf_counter() - t0) * 1e3
