"""vane's per-op-kind step timing (csrc/vane/vane_profile.c via orion.runtime)."""

from __future__ import annotations

import numpy as np
import pytest

from orion.runtime import Program, vane_profile, vane_profile_read
from orion.runtime.blob import blob_bytes
from vane.milgen import Mil
from vane.refs import f16

pytestmark = pytest.mark.native

WKEY = "@model_path/weights/w.bin"


def conv_tanh_program(c: int, o: int, s: int, offset: int) -> str:
    m = Mil()
    m.input("xa", (1, c, 1, s))
    y = m.conv("xa", m.blob((o, c, 1, 1), WKEY, offset), (1, o, 1, s))
    m.op("tanh", (1, o, 1, s), result_name="ya", x=y)
    return m.text(["ya"])


def test_profile_counts_each_step_by_kind_and_shape(no_leaks):
    c, o, s = 768, 768, 32
    rng = np.random.default_rng(0)
    blob, offs = blob_bytes([("w", f16(rng.standard_normal((o, c, 1, 1)) / 8))])
    x = f16(rng.standard_normal((1, c, 1, s)))
    with Program.compile(conv_tanh_program(c, o, s, offs["w"]), {WKEY: blob},
                         backend="vane") as p:
        p.run({"xa": x})
        vane_profile(True)
        try:
            assert vane_profile_read() == []      # turning it on resets the counters
            for _ in range(3):
                p.run({"xa": x})
            rows = {(r.op, r.shape): r for r in vane_profile_read()}
        finally:
            vane_profile(False)
        assert rows[("conv", "gemm")].steps == 3
        assert rows[("tanh", "")].steps == 3
        assert all(r.seconds >= 0 for r in rows.values())
        assert rows[("conv", "gemm")].seconds > 0
        p.run({"xa": x})                           # off: nothing more is counted
        after = {(r.op, r.shape): r.steps for r in vane_profile_read()}
        assert after[("conv", "gemm")] == 3
