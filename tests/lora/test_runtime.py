"""Adapters as program inputs: PEFT's logits, hot-swap with no compile, several
adapters at once, the base model when none is selected."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import orion
from lora.conftest import peft_adapter, peft_logits
from orion.errors import LoraError
from orion.models.adapters import Adapter
from orion.runtime import Program, compile_count

TOL = 2e-2   # fp16 activations through 2 layers; logits are O(1)


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    one = peft_adapter(llama_dir, root / "one", seed=1)
    two = peft_adapter(llama_dir, root / "two", seed=2, targets=("q_proj", "v_proj", "down_proj"),
                       r=8, alpha=4.0, rank_pattern={"down_proj": 2},
                       alpha_pattern={"model.layers.1.self_attn.q_proj": 16.0},
                       use_rslora=True)
    return one, two


@pytest.mark.slow
def test_logits_equal_peft_for_two_adapters_swapped_without_compiling(llama_dir, adapters,
                                                                      monkeypatch):
    ids = np.random.default_rng(0).integers(0, 2048, 64)
    ref = {name: peft_logits(llama_dir, ad, ids) for name, ad in
           (("one", adapters[0]), ("two", adapters[1]), (None, None))}
    assert np.abs(ref["one"] - ref[None]).max() > 20 * TOL   # the adapters matter
    assert np.abs(ref["two"] - ref[None]).max() > 20 * TOL
    model, _ = orion.load(llama_dir)
    model.load_adapter(adapters[0], "one")
    model.load_adapter(adapters[1], "two")
    spent = []
    for name in ("one", "two", None):     # compile each signature once
        before = compile_count()
        model.set_adapter(name)
        model.prefill(ids, all_logits=True)
        spent.append(compile_count() - before)
    assert all(n > 0 for n in spent)      # three signatures: three sets of programs
    for name in ("one", "two", None):     # a build unloads every program (peak RSS):
        model.set_adapter(name)           # each loads here once
        model.prefill(ids, all_logits=True)
    compiled = compile_count()
    reloads = []   # any load, unload or weight patch of a program during the swaps
    for method in ("load", "unload", "update_weights"):
        original = getattr(Program, method)
        monkeypatch.setattr(Program, method, lambda self, *a, _m=method, _o=original, **k:
                            (reloads.append(_m), _o(self, *a, **k))[1])
    for name in ("one", "two", None, "two", "one", None, "one"):
        model.set_adapter(name)
        got = model.prefill(ids, all_logits=True)
        err = np.abs(got - ref[name]).max()
        assert err < TOL, (name, err)
    assert compile_count() == compiled and reloads == []
    # same modules and ranks, other weights and scale: the cached programs serve it
    one = model.adapters.adapters["one"]
    scaled = Adapter(replace(one.config, alpha=2 * one.config.alpha), one.arch,
                     {k: (a, -b) for k, (a, b) in one.matrices.items()})
    model.adapters.add(scaled, "one_scaled")
    model.set_adapter("one_scaled")
    got = model.prefill(ids, all_logits=True)
    assert compile_count() == compiled
    model.adapters.add(Adapter(one.config, one.arch, {k: (a, -2 * b) for k, (a, b) in
                                                       one.matrices.items()}), "check")
    model.set_adapter("check")
    assert np.abs(got - model.prefill(ids, all_logits=True)).max() < 1e-3
    model.close()


def test_unknown_adapter_name_is_an_error(llama_dir):
    model, _ = orion.load(llama_dir)
    with pytest.raises(LoraError, match="no adapter named 'x'"):
        model.set_adapter("x")
    model.close()


def test_load_with_adapter_path_selects_it(llama_dir, adapters):
    ids = list(range(5, 37))
    model, _ = orion.load(llama_dir, adapter_path=adapters[0])
    assert model.adapters.active == "default"
    got = model.prefill(ids, all_logits=True)
    assert np.abs(got - peft_logits(llama_dir, adapters[0], ids)).max() < TOL
    model.close()


@pytest.mark.slow
def test_generate_selects_the_adapter_for_one_call(llama_dir, adapters):
    model, _ = orion.load(llama_dir)
    model.load_adapter(adapters[1], "two")
    ids = [3, 4, 5, 6]
    with_two = orion.generate(model, ids, max_tokens=8, adapter="two")
    assert model.adapters.active is None       # restored after the call
    base = orion.generate(model, ids, max_tokens=8)
    model.set_adapter("two")
    assert orion.generate(model, ids, max_tokens=8) == with_two != base
    model.close()
