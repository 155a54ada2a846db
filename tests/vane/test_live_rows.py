"""Decode attention over the live rows of a KV cache: an input surface whose zero-tail
promise (Surface.set_zero_tail) has one block per head lets vane's matmuls skip the rows
past the live ones. The outputs keep every bit of the full products; the rows past the
live ones are not read (a broken promise shows it); a query that is not finite, or a
promise whose blocks are not the heads, computes in full."""

from __future__ import annotations

import numpy as np
import pytest

from orion.runtime import Program, Surface
from vane.milgen import Mil, from_io, io_elems, to_io

pytestmark = pytest.mark.native

H, G, T, HD = 4, 2, 96, 64   # H * T * HD = 24576: a cache fills one minimum-size input
ROW = HD * 2                 # bytes of one cached row
SCORES, VALUES = (1, H, G, T), (1, H, G, HD)


def attention_program() -> str:
    """scores = q k^T and o = p v per head, with k and v read from cache inputs."""
    m = Mil()
    q = m.wrap_input("a_q", (1, H, G, HD))
    k = m.wrap_input("b_k", (1, H, T, HD))
    p = m.wrap_input("c_p", (1, H, G, T))
    v = m.wrap_input("d_v", (1, H, T, HD))
    no, yes = m.const(False, "bool"), m.const(True, "bool")
    scores = m.op("matmul", SCORES, x=q, y=k, transpose_x=no, transpose_y=yes)
    out = m.op("matmul", VALUES, x=p, y=v, transpose_x=no, transpose_y=no)
    return m.text([m.wrap_output(scores, "y_scores"), m.wrap_output(out, "z_out")])


@pytest.fixture(scope="module")
def program():
    prog = Program.compile(attention_program(), {}, backend="vane")
    prog.load()
    yield prog
    prog.release()


def _cache(rng: np.random.Generator, live: int, past: float) -> np.ndarray:
    """[1, H, T, HD] with random live rows, and `past` in every row after them."""
    c = rng.standard_normal((1, H, T, HD)).astype(np.float16)
    c[:, :, live:] = past
    return c


def _run(program: Program, q, k, p, v, promise: tuple[int, int] | None):
    ins = [Surface(io_elems(H * T * HD) * 2) for _ in range(4)]
    outs = [Surface(io_elems(H * T * HD) * 2) for _ in range(2)]
    for s, a in zip(ins, (q, k, p, v), strict=True):
        s.write(to_io(a))
    if promise:
        ins[1].set_zero_tail(*promise)
        ins[3].set_zero_tail(*promise)
    program.eval(ins, outs)
    n_io = io_elems(H * T * HD)
    got = [from_io(o.read((1, n_io // 32, 1, 32)), shape)
           for o, shape in zip(outs, (SCORES, VALUES), strict=True)]
    for s in ins + outs:
        s.release()
    return got


@pytest.mark.parametrize("live", [0, 1, 37, T - 1, T])
def test_attention_over_live_rows_keeps_every_bit(program, live):
    rng = np.random.default_rng(live)
    q = rng.standard_normal((1, H, G, HD)).astype(np.float16)
    p = rng.uniform(0, 1, (1, H, G, T)).astype(np.float16)
    k, v = _cache(rng, live, 0.0), _cache(rng, live, 0.0)
    full = _run(program, q, k, p, v, None)
    promised = _run(program, q, k, p, v, (T * ROW, live * ROW))
    for a, b in zip(full, promised, strict=True):
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
    assert (full[0][..., live:].view(np.uint16) == 0).all()    # +0 scores past the live rows
    assert live == 0 or np.abs(full[1]).max() > 0


def test_rows_past_the_live_ones_are_not_read(program):
    """A promise broken on purpose (ones past the live rows) gives what the zeros give:
    the skip is taken. With blocks that are not the heads, or an inf in the query, the
    same broken cache computes in full."""
    live = 40
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, H, G, HD)).astype(np.float16)
    p = rng.uniform(0, 1, (1, H, G, T)).astype(np.float16)
    k, v = _cache(rng, live, 0.0), _cache(rng, live, 0.0)
    k1, v1 = k.copy(), v.copy()
    k1[:, :, live:], v1[:, :, live:] = 1.0, 1.0
    zeros = _run(program, q, k, p, v, None)
    broken = _run(program, q, k1, p, v1, (T * ROW, live * ROW))
    for a, b in zip(zeros, broken, strict=True):
        np.testing.assert_array_equal(a, b)

    ones = _run(program, q, k1, p, v1, None)
    assert not np.array_equal(ones[0], zeros[0]) and not np.array_equal(ones[1], zeros[1])
    other_blocks = _run(program, q, k1, p, v1, (2 * T * ROW, live * ROW))
    for a, b in zip(ones, other_blocks, strict=True):
        np.testing.assert_array_equal(a, b)

    q_inf = q.copy()
    q_inf[0, 1, 0, 3] = np.inf      # inf * 0 is NaN in the full product: head 1 in full
    inf_full = _run(program, q_inf, k1, p, v1, None)
    inf_promised = _run(program, q_inf, k1, p, v1, (T * ROW, live * ROW))
    np.testing.assert_array_equal(inf_full[0][:, 1].view(np.uint16),
                                  inf_promised[0][:, 1].view(np.uint16))
    np.testing.assert_array_equal(inf_promised[0][:, 0], zeros[0][:, 0])
