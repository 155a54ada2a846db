"""Live columns (`Program.set_live_columns`): of a program's token columns only `live`
from column `first` on matter (a verify of fewer tokens than its bucket, a batched step
of a few slots), so vane computes those alone in each 1x1 conv over that many columns
and writes zeros to the others. The live
columns keep every bit of the full product; past 32 columns, where the product sums in
another order, every column is computed; the hint stays until changed, and bad
arguments are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import InvalidArgumentError
from orion.runtime import Program
from orion.runtime.blob import blob_bytes
from vane.milgen import Mil, from_io, to_io
from vane.refs import f16

pytestmark = pytest.mark.native

WKEY = "@model_path/weights/w.bin"
C, OUT = 192, 320   # in and out channels of the conv


def _program(columns: int, rng: np.random.Generator) -> Program:
    """y = conv(x) over [1, C, 1, columns], then tanh (an op that is not a conv)."""
    blob, offs = blob_bytes([("w", f16(rng.standard_normal((OUT, C, 1, 1)) / 8))])
    m = Mil()
    x = m.wrap_input("a_x", (1, C, 1, columns))
    y = m.conv(x, m.blob((OUT, C, 1, 1), WKEY, offs["w"]), (1, OUT, 1, columns))
    t = m.op("tanh", (1, OUT, 1, columns), x=y)
    prog = Program.compile(m.text([m.wrap_output(t, "y_out")]), {WKEY: blob}, backend="vane")
    prog.load()
    return prog


def _eval(prog: Program, x: np.ndarray) -> np.ndarray:
    return from_io(prog.run({"a_x": to_io(x)})["y_out"], (OUT, x.shape[-1]))


@pytest.mark.parametrize(("columns", "first", "live"),
                         [(8, 0, 1), (8, 0, 5), (8, 0, 8), (16, 0, 11), (32, 0, 20),
                          (16, 15, 1), (16, 8, 7), (8, 3, 4), (32, 1, 31)])
def test_live_columns_keep_their_bits_and_the_rest_are_zeros(columns, first, live):
    rng = np.random.default_rng(columns * 100 + first * 10 + live)
    x = f16(rng.standard_normal((1, C, 1, columns)))
    end = first + live
    with _program(columns, rng) as prog:
        full = _eval(prog, x)
        prog.set_live_columns(columns, live, first)
        part = _eval(prog, x)
        np.testing.assert_array_equal(part[:, first:end].view(np.uint16),
                                      full[:, first:end].view(np.uint16))
        dead = np.concatenate([part[:, :first], part[:, end:]], axis=1)
        assert (dead.view(np.uint16) == 0).all()   # tanh(+0): not computed
        assert live == columns or np.abs(np.concatenate(
            [full[:, :first], full[:, end:]], axis=1)).max() > 0
        prog.set_live_columns(columns, live, first)            # it stays for every eval
        np.testing.assert_array_equal(_eval(prog, x), part)
        prog.set_live_columns(0, 0)                            # every column again
        np.testing.assert_array_equal(_eval(prog, x), full)


def test_a_hint_for_other_columns_or_past_32_changes_nothing():
    rng = np.random.default_rng(3)
    x = f16(rng.standard_normal((1, C, 1, 64)))
    with _program(64, rng) as prog:
        full = _eval(prog, x)
        prog.set_live_columns(64, 7)    # past 32 columns: the product is a GEMM
        np.testing.assert_array_equal(_eval(prog, x), full)
        prog.set_live_columns(16, 7)    # no conv of 16 columns
        np.testing.assert_array_equal(_eval(prog, x), full)


@pytest.mark.parametrize(("columns", "first", "live"),
                         [(8, 0, 0), (8, 0, 9), (0, 0, 1), (0, 1, 0), (8, 8, 1), (8, 5, 4),
                          (8, 2**32 - 1, 2)])
def test_bad_live_columns_are_refused(columns, first, live):
    with _program(8, np.random.default_rng(0)) as prog:
        with pytest.raises(InvalidArgumentError,
                           match=f"live columns: {live} from column {first} of {columns}"):
            prog.set_live_columns(columns, live, first)


@pytest.mark.parametrize("bad", [-1, 2**64, 2.0, True, None])
def test_live_columns_that_are_not_counts_are_refused(bad):
    with _program(8, np.random.default_rng(0)) as prog:
        with pytest.raises(InvalidArgumentError, match="live columns: live must be"):
            prog.set_live_columns(8, bad)
        with pytest.raises(InvalidArgumentError, match="live columns: first must be"):
            prog.set_live_columns(8, 1, bad)
