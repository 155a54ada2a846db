"""Quantized sources in the program store (on by default for users; the test suite
turns it off): an MLX folder and a GGUF file load with it on, and a second load opens
the compiled programs without a compile and gives the same logits."""

from __future__ import annotations

import numpy as np
import pytest

from orion.models.registry import load_model
from orion.runtime import compile_count
from quant.conftest import mlx_convert
from quant.gguf_writer import write_gguf

pytestmark = pytest.mark.native
IDS = [1, 5, 9, 200, 300, 7, 8]
SMALL = {"prefill_buckets": (32,), "decode_buckets": (256,), "reuse_programs": True}


def _run(path) -> tuple[np.ndarray, int]:
    before = compile_count()
    model = load_model(path, **SMALL)
    try:
        logits = np.stack([model.prefill(IDS), model.decode(4), model.decode(40)])
    finally:
        model.close()
    return logits, compile_count() - before


@pytest.mark.parametrize("kind", ["mlx", "gguf"])
def test_a_second_load_opens_the_stored_programs(kind, qwen3_hf, tmp_path, monkeypatch):
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    path = (mlx_convert(qwen3_hf, tmp_path / "mlx4") if kind == "mlx"
            else write_gguf(qwen3_hf, tmp_path / "m.gguf", "Q4_0"))
    first, compiled = _run(path)
    again, recompiled = _run(path)
    assert compiled > 0 and recompiled == 0
    np.testing.assert_array_equal(first, again)
