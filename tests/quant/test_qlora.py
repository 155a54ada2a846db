"""LoRA on a quantized frozen base (QLoRA's shape): the shipped Llama converted to MLX
4-bit trains an adapter with its matrices compressed in the programs (forward and the
backward's W^T), computes exactly what the same programs compute on the dense decoded
weights, lowers the validation loss, and the adapter runs on the quantized model."""

from __future__ import annotations

import numpy as np
import pytest
from lora.test_trainer import modern_text, write_data

from orion.cli import main
from orion.formats.peft import LoraConfig
from orion.lora.step import LoraStep
from orion.lora.trainer import LoraTrainConfig, LoraTrainer
from orion.models import default_model_path, load_model
from orion.models.adapters import init_adapter
from orion.models.frozen import frozen_base

pytestmark = pytest.mark.native
MODULES = ("q_proj", "v_proj", "down_proj")


@pytest.fixture(scope="module")
def base_4bit(tmp_path_factory):
    out = tmp_path_factory.mktemp("qlora") / "shakespeare-4bit"
    assert main(["convert", "-m", str(default_model_path()), "--out", str(out), "--bits", "4",
                 "--group-size", "64"]) == 0
    return out


def steps_on_compressed_and_dense(folder, targets: tuple[str, ...], vocab: int) -> list:
    """One LoRA step (a nonzero B, 32 tokens) over the folder's frozen compressed base,
    then over its decoded weights as dense arrays: the two steps' outputs."""
    arch, frozen, _ = frozen_base(folder)
    assert frozen.quant("model.layers.0.mlp.down_proj.weight") is not None
    dense = {n: frozen[n] for n in frozen}   # the host's decoded weights, as arrays
    adapter = init_adapter(LoraConfig(r=4, alpha=8.0, targets=targets), arch, seed=3)
    for (layer, _), (_, b) in adapter.matrices.items():   # a nonzero B
        b[...] = np.random.default_rng(layer).standard_normal(b.shape) * 0.05
    tokens = np.random.default_rng(0).integers(0, vocab, (1, 32))
    shifted, mask = np.roll(tokens, -1, axis=1), np.ones((1, 32), np.int32)
    outs = []
    for weights in (frozen, dense):
        step = LoraStep(arch, weights, adapter, 32)
        try:
            outs.append(step(adapter, tokens, shifted, mask))
        finally:
            step.release()
    return outs


def test_gradients_equal_the_dense_decoded_base(base_4bit):
    outs = steps_on_compressed_and_dense(base_4bit, MODULES, 2048)
    assert outs[0].loss == outs[1].loss
    for name in outs[0].grads:
        np.testing.assert_array_equal(outs[0].grads[name], outs[1].grads[name], err_msg=name)


@pytest.mark.slow
def test_fine_tune_on_the_4bit_base_and_run_the_adapter(base_4bit, tmp_path):
    data = write_data(tmp_path / "data", modern_text())
    cfg = LoraTrainConfig(iters=10, batch_size=4, lr=3e-3, max_seq_length=64, val_every=0,
                          rank=8, alpha=16, targets=MODULES)
    tr = LoraTrainer(base_4bit, data, tmp_path / "out", cfg, progress=False)
    try:
        before = tr.evaluate()
        after = tr.fit()[-1].extra["val_loss"]
    finally:
        tr.close()
    assert after < before - 0.05, (before, after)
    with load_model(base_4bit, adapter_path=tmp_path / "out") as m:
        with_adapter = m.prefill(list(range(10, 40)))
    with load_model(base_4bit) as m:
        assert np.abs(m.prefill(list(range(10, 40))) - with_adapter).max() > 1e-3
