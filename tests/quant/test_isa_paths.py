"""vane's AVX-512 path without AVX512-FP16's arithmetic (`ORION_VANE_ISA=avx512-f16c`,
what Zen 4 and Ice Lake run) against the path with it: a quantized weight's value is the
same fp16 whichever instructions build its block's table, and the fused rows sum as the
dense GEMV does on both, so a quantized model's logits are the same bits. Each path runs
in its own process, as a user selects it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from child_process import OUTSIDE, child_env

from orion.runtime import vane_isa
from quant.gguf_writer import write_gguf

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(vane_isa() != "avx512", reason=(
        f"needs AVX-512 (vane runs {vane_isa()} here); runs on this project's CI machines")),
]

# the logits after a prompt and two decode steps, saved where argv[2] says
LOGITS = """
import sys
import numpy as np
from orion.models.registry import load_model
from orion.runtime import vane_isa
assert vane_isa() == "avx512", vane_isa()
model = load_model(sys.argv[1], prefill_buckets=(32,), decode_buckets=(64,))
out = [model.prefill(np.array([1, 5, 9, 200, 300, 7, 8, 9, 10, 11]))]
out += [model.decode(t) for t in (4, 40)]
np.save(sys.argv[2], np.stack(out))
"""


def _logits(path, isa: str, out) -> np.ndarray:
    done = subprocess.run([sys.executable, "-c", LOGITS, str(path), str(out)],
                          env=child_env(ORION_VANE_ISA=isa), cwd=OUTSIDE,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return np.load(out)


@pytest.mark.parametrize("form", ["mlx4", "Q4_0", "Q4_K", "Q8_0"])
def test_f16c_tables_give_the_native_bits(form, qwen3_mlx4, llama_hf, tmp_path):
    """MLX 4-bit (offsets, blocks of 64), Q4_0 (signed), Q4_K (offsets, blocks of 32)
    and Q8_0 (8-bit rows)."""
    pytest.importorskip("gguf")
    path = qwen3_mlx4 if form == "mlx4" else write_gguf(llama_hf, tmp_path / "m.gguf", form)
    native = _logits(path, "avx512", tmp_path / "native.npy")
    f16c = _logits(path, "avx512-f16c", tmp_path / "f16c.npy")
    assert np.isfinite(native).all()
    assert np.array_equal(native.view(np.uint16), f16c.view(np.uint16))
