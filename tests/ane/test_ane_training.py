"""Training on the ane backend (stand-in framework) against vane, in the stand-in's mode
(ANE_STANDIN_MODE; tests/ane/build_standin.sh runs this file once per mode): 20 steps
give vane's losses to fp16 tolerance, or a clear refusal naming the `inputs` strategy,
never a run on stale weights."""

from __future__ import annotations

import os

import numpy as np
import pytest
from train.conftest import shakespeare, sp_model  # noqa: F401 - fixtures

from orion.errors import CompileBudgetError
from orion.runtime import backends, compile_budget, compile_count, set_compile_budget
from orion.train.config import TrainConfig
from orion.train.trainer import Trainer

pytestmark = pytest.mark.native

STEPS = 20
WHERE = "runs in .ci/run via tests/ane/build_standin.sh (ane backend built against the stand-in)"
# The device's own compile limit (~119 per process, ANE-C31), for this run: the suite
# lifts the runtime's budget, which would hide how quickly recompiles run out.
DEVICE_BUDGET = 40


def _config(backend: str, model_path, update: str | None) -> TrainConfig:
    return TrainConfig(model={"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64},
                       tokenizer=str(model_path), batch_size=2, seq_len=32, steps=STEPS, lr=3e-3,
                       min_lr=3e-4, warmup=5, checkpoint_every=0, backend=backend, seed=3,
                       update=update)


def _losses(cfg: TrainConfig, corpus, out) -> tuple[list[float], str]:
    tr = Trainer(cfg, corpus, out, progress=False)
    try:
        return [r.loss for r in tr.fit()], tr.programs.strategy
    finally:
        tr.close()


@pytest.mark.parametrize("update", [None, "inputs", "delta"])
def test_twenty_steps_match_vane_or_refuse(tmp_path, shakespeare, sp_model, update):  # noqa: F811
    if not os.environ.get("ORION_ANE_FRAMEWORK") or "ane" not in backends():
        pytest.skip(f"the ane backend on the stand-in is not loaded here ({WHERE})")
    want, vane_strategy = _losses(_config("vane", sp_model, update), shakespeare, tmp_path / "v")
    assert vane_strategy == (update or "delta")
    old = compile_budget()
    set_compile_budget(compile_count() + DEVICE_BUDGET)
    try:
        got, strategy = _losses(_config("ane", sp_model, update), shakespeare, tmp_path / "a")
    except CompileBudgetError as e:
        # a delta the device did not take, recompiled until the budget ran out
        assert update == "delta" and os.environ.get("ANE_STANDIN_MODE") != "permissive"
        assert "update='inputs'" in str(e)
        return
    finally:
        set_compile_budget(old)
    assert strategy == (update or "inputs")   # inputs is the default on ane
    assert len(got) == STEPS and all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
