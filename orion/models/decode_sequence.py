"""A decode token's programs and host copies as one `orion.runtime.sequence.EvalSequence`.

Every architecture decodes alike: a layer program (one layer, or several consecutive
ones: `orion.models.plan`) reads the token's hidden state `x`, each of its layers' key
and value caches and the masks (and more inputs after them: RoPE, LoRA), and writes
the next hidden state `h` and each layer's new key and value rows; head programs turn
the last `h` into logits. After a program the host moves each new key and value row
into its layer's cache at the token's position, and `h` into `x`. Run from Python
that is a round trip per program; here it is one C call per token.

    steps = DecodeSequences(x_in, h_out, h_bytes=d * 2)
    steps.run(cache, pos, [DecodeStep(prog, inputs, outputs, appends), ...],
              heads=[(prog, inputs, outputs), ...])
    steps.rerun(cache, pos + 1)   # the same programs and inputs, all still loaded
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orion.models.kv_cache import KVCache
from orion.runtime.sequence import EvalSequence

Head = tuple[Any, Sequence[Any], Sequence[Any]]   # (program, inputs, outputs)


@dataclass(frozen=True)
class DecodeStep:
    """One layer program of a token: its surfaces in binding order, and for each of
    its layers the (new row, cache) surface pairs of the key and the value, in the
    order `KVCache.append_copy` writes them."""

    program: Any
    inputs: Sequence[Any]
    outputs: Sequence[Any]
    appends: Sequence[tuple[Any, Any]]

    def objects(self) -> list[Any]:
        return [self.program, *self.inputs, *self.outputs,
                *(s for pair in self.appends for s in pair)]


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class DecodeSequences:
    """One sequence per decode bucket, built on first use and rebuilt when a step's
    program or surfaces change (another program, a LoRA adapter's inputs).

    x_in, h_out: the surfaces every layer program shares (its input x and output h);
    h_bytes: the bytes of `h` that are the next program's `x` (the hidden state,
    without padding)."""

    def __init__(self, x_in: Any, h_out: Any, h_bytes: int) -> None:
        self._x_in, self._h_out = x_in, h_out
        self._h_bytes = h_bytes
        self._built: dict[int, tuple[list[Any], EvalSequence]] = {}

    def run(self, cache: KVCache, pos: int, layers: Sequence[DecodeStep],
            heads: Sequence[Head]) -> None:
        """Runs every layer program at position `pos` of `cache` (laid out for its
        bucket), then the heads; marks `pos` written in the cache."""
        objects = [x for step in layers for x in step.objects()]
        objects += [x for prog, ins, outs in heads for x in (prog, *ins, *outs)]
        built = self._built.get(cache.bucket)
        if built is None or not _same(built[0], objects):
            if built is not None:
                built[1].release()
            built = (objects, self._build(cache, layers, heads))
            self._built[cache.bucket] = built
        built[1].run(pos)
        cache.appended(pos)

    def rerun(self, cache: KVCache, pos: int) -> bool:
        """Runs the sequence last built for `cache`'s bucket again at `pos`, skipping the
        caller's per-token program checks; False, with nothing run, when there is none or
        one of its programs is not loaded any more (the caller then takes the full path).
        Only for a caller that knows the same programs and inputs are still the ones."""
        built = self._built.get(cache.bucket)
        if built is None or not built[1].ready():
            return False
        built[1].run(pos)
        cache.appended(pos)
        return True

    def _build(self, cache: KVCache, layers: Sequence[DecodeStep],
               heads: Sequence[Head]) -> EvalSequence:
        seq = EvalSequence()
        rows = cache.append_copy()
        for n, step in enumerate(layers):
            seq.eval(step.program, step.inputs, step.outputs)
            for src, dst in step.appends:
                seq.copy(src, dst, **rows)
            if n < len(layers) - 1:
                seq.copy(self._h_out, self._x_in, row_bytes=self._h_bytes)
        for prog, ins, outs in heads:
            seq.eval(prog, ins, outs)
        return seq

    def release(self) -> None:
        for _, seq in self._built.values():
            seq.release()
        self._built.clear()
