"""vane's warm-up: through a run of small steps an idle pool worker reads ahead the
weights and input surfaces the next steps read, and `Program.prefetch` starts on a
program's first weights (csrc/vane/vane_backend.c, `vk_warm_async`). It only reads:
no result may change, and no memory may be read once it can be freed (an unload, a
release, the caller taking its surfaces back after an eval). A read of freed memory
here is a crash, or an ASan report in the sanitizer pass (.ci/sanitize.sh)."""

from __future__ import annotations

import numpy as np
import pytest

from orion.errors import OrionError
from orion.runtime import Program, num_threads, set_num_threads, vane_warm
from orion.runtime.blob import blob_bytes
from vane.milgen import Mil
from vane.refs import f16

pytestmark = pytest.mark.native

WKEY = "@model_path/weights/w.bin"
C, S = 256, 128   # every weight and the input 64 KiB or more: all of them are warmed


def _two_conv_program(off1: int, off2: int) -> str:
    """conv -> tanh -> conv -> add the input: while the tanh (a small step) runs, the
    worker warms w2 and the input surface, which the add reads again."""
    m = Mil()
    m.input("xa", (1, C, 1, S))
    y = m.conv("xa", m.blob((C, C, 1, 1), WKEY, off1), (1, C, 1, S))
    t = m.op("tanh", (1, C, 1, S), x=y)
    z = m.conv(t, m.blob((C, C, 1, 1), WKEY, off2), (1, C, 1, S))
    m.op("add", (1, C, 1, S), result_name="ya", x=z, y="xa")
    return m.text(["ya"])


@pytest.fixture
def two_threads():
    before = num_threads()
    set_num_threads(2)   # the warm-up needs an idle worker
    yield
    set_num_threads(before)
    vane_warm(True)


def _compile(rng: np.random.Generator) -> Program:
    blob, offs = blob_bytes([("w1", f16(rng.standard_normal((C, C, 1, 1)) / 16)),
                             ("w2", f16(rng.standard_normal((C, C, 1, 1)) / 16))])
    return Program.compile(_two_conv_program(offs["w1"], offs["w2"]), {WKEY: blob},
                           backend="vane")


def test_warm_up_changes_no_result(no_leaks, two_threads):
    rng = np.random.default_rng(11)
    x = f16(rng.standard_normal((1, C, 1, S)))
    with _compile(rng) as p:
        p.load()
        vane_warm(False)
        want = p.run({"xa": x})["ya"].copy()
        vane_warm(True)
        for _ in range(20):
            p.prefetch()
            np.testing.assert_array_equal(p.run({"xa": x})["ya"], want)
        set_num_threads(1)   # no worker, no warm-up: the same bits
        np.testing.assert_array_equal(p.run({"xa": x})["ya"], want)


def test_memory_freed_after_a_prefetch_or_an_eval_is_not_read(no_leaks, two_threads):
    rng = np.random.default_rng(12)
    x = f16(rng.standard_normal((1, C, 1, S)))
    for _ in range(15):
        p = _compile(rng)
        p.load()
        p.run({"xa": x})      # its input surfaces are released as it returns
        p.prefetch()
        p.unload()            # the weights go while the worker may be reading them
        p.prefetch()          # not loaded: nothing to do
        p.load()
        p.prefetch()
        p.release()
        with pytest.raises(OrionError):
            p.prefetch()
