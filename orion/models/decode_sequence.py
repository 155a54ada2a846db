"""A decode token's programs and host copies as one `orion.runtime.sequence.EvalSequence`.

GPT-2 and the Llama family decode alike: one program per layer reads the token's
hidden state `x`, the layer's key and value caches and the mask (and more inputs after
them: RoPE, LoRA), and writes the next hidden state `h` and the token's key and value
rows; a head program turns the last `h` into logits. Between two layers the host moves
the key and value rows into the cache at the token's position and `h` into `x`. Run
from Python that is a round trip per layer; here it is one C call per token.

    steps = DecodeSequences(x_in, h_out, k_out, v_out, h_bytes=d * 2)
    steps.run(cache, pos, layers=[(prog, inputs), ...], head=(prog, inputs, outputs))
    steps.rerun(cache, pos + 1)   # the same programs and inputs, all still loaded
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orion.models.kv_cache import KVCache
from orion.runtime.sequence import EvalSequence


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class DecodeSequences:
    """One sequence per decode bucket, built on first use and rebuilt when a step's
    program or surfaces change (another program, a LoRA adapter's inputs).

    x_in, h_out, k_out, v_out: the surfaces every layer shares (the layer's inputs
    [x, k_i, v_i, ...] and outputs [h, k_out, v_out]); h_bytes: the bytes of `h` that
    are the next layer's `x` (the hidden state, without padding)."""

    def __init__(self, x_in: Any, h_out: Any, k_out: Any, v_out: Any, h_bytes: int) -> None:
        self._x_in, self._h_out, self._k_out, self._v_out = x_in, h_out, k_out, v_out
        self._h_bytes = h_bytes
        self._built: dict[int, tuple[list[Any], EvalSequence]] = {}

    def run(self, cache: KVCache, pos: int, layers: Sequence[tuple[Any, Sequence[Any]]],
            head: tuple[Any, Sequence[Any], Sequence[Any]]) -> None:
        """Runs every layer at position `pos` of `cache` (laid out for its bucket), then
        the head; marks `pos` written in the cache."""
        steps = [x for prog, ins in layers for x in (prog, *ins)] + [head[0], *head[1], *head[2]]
        built = self._built.get(cache.bucket)
        if built is None or not _same(built[0], steps):
            if built is not None:
                built[1].release()
            built = (steps, self._build(cache, layers, head))
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

    def _build(self, cache: KVCache, layers: Sequence[tuple[Any, Sequence[Any]]],
               head: tuple[Any, Sequence[Any], Sequence[Any]]) -> EvalSequence:
        seq = EvalSequence()
        rows = cache.append_copy()
        outs = [self._h_out, self._k_out, self._v_out]
        for i, (prog, ins) in enumerate(layers):
            seq.eval(prog, ins, outs)
            seq.copy(self._k_out, ins[1], **rows)   # inputs [x, k_i, v_i, ...]
            seq.copy(self._v_out, ins[2], **rows)
            if i < len(layers) - 1:
                seq.copy(self._h_out, self._x_in, row_bytes=self._h_bytes)
        seq.eval(head[0], head[1], head[2])
        return seq

    def release(self) -> None:
        for _, seq in self._built.values():
            seq.release()
        self._built.clear()
