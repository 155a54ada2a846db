"""Evals and host copies declared once and run by one C call (`orion_sequence_*`).

A decode token evaluates one program per layer, with small host copies between them.
Run from Python, each of those steps comes back to an interpreter whose state the
layer's weight stream has pushed out of the CPU caches; a sequence runs them in C.

    seq = EvalSequence()
    seq.eval(layer0, [x, k0, v0, mask], [h, k_new, v_new])
    seq.copy(k_new, k0, rows=heads, row_bytes=hd * 2, src_stride=hd * 2,
             dst_stride=T * hd * 2, dst_step=hd * 2)    # row `position` of each head
    seq.copy(h, x, row_bytes=d * 2)
    seq.eval(layer1, ...)
    seq.run(position)

Each eval is checked as `Program.eval` checks it, and the next eval's program is
prefetched after it. The sequence keeps its programs and surfaces alive.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from orion.errors import InvalidArgumentError
from orion.runtime import Program, Surface
from orion.runtime._native import check, ffi, lib


class EvalSequence:
    """Steps run in order by `run(position)`; the first failure stops it and names its
    step (the steps before it have written their outputs)."""

    def __init__(self) -> None:
        out = ffi.new("orion_sequence *")
        check(lib.orion_sequence_create(out))
        self._handle: int | None = int(out[0])
        self._lock = threading.Lock()
        self._keep: list[object] = []   # what the C steps refer to by handle
        self.steps = 0

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise InvalidArgumentError("the sequence was released")
        return self._handle

    def eval(self, program: Program, inputs: Sequence[Surface],
             outputs: Sequence[Surface]) -> None:
        """Appends an eval; surfaces in binding order, as `Program.eval` takes them."""
        ins = ffi.new("orion_surface[]", [s.handle for s in inputs] or [0])
        outs = ffi.new("orion_surface[]", [s.handle for s in outputs] or [0])
        check(lib.orion_sequence_add_eval(self.handle, program.handle, ins, len(inputs),
                                          outs, len(outputs)))
        self._keep += [program, *inputs, *outputs]
        self.steps += 1

    def copy(self, src: Surface, dst: Surface, *, row_bytes: int, rows: int = 1,
             src_offset: int = 0, src_stride: int = 0, dst_offset: int = 0,
             dst_stride: int = 0, dst_step: int = 0) -> None:
        """Appends a copy of `rows` rows of `row_bytes`: row r from
        src_offset + r*src_stride to dst_offset + position*dst_step + r*dst_stride."""
        sizes = {"row_bytes": row_bytes, "rows": rows, "src_offset": src_offset,
                 "src_stride": src_stride, "dst_offset": dst_offset,
                 "dst_stride": dst_stride, "dst_step": dst_step}
        negative = [k for k, v in sizes.items() if v < 0]
        if negative:
            raise InvalidArgumentError(f"sequence copy: {', '.join(negative)} must be >= 0")
        c = ffi.new("orion_sequence_copy *")
        c.src, c.dst = src.handle, dst.handle
        c.src_offset, c.src_stride = src_offset, src_stride
        c.dst_offset, c.dst_stride, c.dst_step = dst_offset, dst_stride, dst_step
        c.rows, c.row_bytes = rows, row_bytes
        check(lib.orion_sequence_add_copy(self.handle, c))
        self._keep += [src, dst]
        self.steps += 1

    def run(self, position: int = 0) -> None:
        if position < 0:
            raise InvalidArgumentError(f"sequence position must be >= 0, not {position}")
        check(lib.orion_sequence_run(self.handle, position))

    def ready(self) -> bool:
        """Whether every program the sequence evaluates is loaded."""
        out = ffi.new("int *")
        check(lib.orion_sequence_ready(self.handle, out))
        return bool(out[0])

    def release(self) -> None:
        """Frees the C sequence and drops its references. Idempotent."""
        with self._lock:
            handle, self._handle = self._handle, None
        self._keep = []
        if handle is not None:
            check(lib.orion_sequence_release(handle))

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def live_sequences() -> int:
    return int(lib.orion_sequence_live_count())
