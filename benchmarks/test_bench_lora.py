"""LoRA on vane, beside PEFT on PyTorch CPU, in one run:

- a LoRA fine-tuning step (all seven target modules, rank 8, batch 4 x 128 tokens) on a
  Stories15M-shaped Llama (dim 288, 6 layers, hidden 768, vocab 32000, random init):
  Orion (forward + activation gradients on vane, base baked; A/B gradients + AdamW on
  the host, whose share is reported separately) against PEFT + torch.optim.AdamW on
  the CPU in fp32 and under bf16 autocast, same model, data and rank;
- the cost of "no adapter": a 128-token prefill on the base programs (zero-rank: what
  Orion runs when no adapter is selected) against the LoRA programs with their inputs
  held at zero, and with a real adapter selected;
- decode tokens/s with no adapter and with one selected (both on the KV-cache decode
  programs; an adapter's are compiled with its A and B' as inputs).

Rounds run the contenders in turns (the machine is shared; single steps move by up to
30%), and the best and median ms are printed. `pytest benchmarks/test_bench_lora.py
-o addopts="" -s` prints the table.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from orion.formats.peft import LoraConfig
from orion.models.adapters import init_adapter
from orion.models.weights import init_weights
from orion.train.config import architecture_of

ARCH = architecture_of({"dim": 288, "n_layers": 6, "n_heads": 6, "n_kv_heads": 6,
                        "vocab_size": 32000, "hidden_dim": 768, "max_seq_len": 256},
                       "stories15M")
CFG = ARCH.args
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SEQ, BATCH, RANK, ROUNDS = 128, 4, 8, 4
PAUSE_S = 0.3     # lets the previous contender's spinning thread pools go idle


@pytest.fixture(scope="module")
def setup():
    weights = init_weights(ARCH, seed=0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CFG.vocab_size, (BATCH, SEQ))
    targets = rng.integers(0, CFG.vocab_size, (BATCH, SEQ))
    adapter = init_adapter(LoraConfig(r=RANK, alpha=16, targets=MODULES), ARCH, seed=0)
    for _a, b in adapter.matrices.values():
        b[...] = rng.standard_normal(b.shape).astype(np.float32) * 0.01
    return weights, tokens, targets, adapter


def _orion_step(weights, tokens, targets, adapter):
    from orion.lora.step import LoraStep
    from orion.train.optim import AdamW

    step = LoraStep(ARCH, weights, adapter, SEQ, "vane")
    params = adapter.params()
    optim = AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.0)
    mask = np.ones_like(tokens)
    host: list[tuple[float, float]] = []

    def run() -> None:
        h0, head0 = step.host_ms, step.head_ms
        out = step(adapter, tokens, targets, mask)
        t = time.perf_counter()
        optim.step(params, out.grads)
        step.write_adapter(adapter)
        host.append((step.host_ms - h0 + (time.perf_counter() - t) * 1e3,
                     step.head_ms - head0))

    return run, step.release, host


def _peft_step(weights, tokens, targets, bf16: bool):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from tests.models.llama_torch import hf_model

    torch.set_num_threads(2)
    model = peft.get_peft_model(hf_model(CFG, weights, "float32"),
                                peft.LoraConfig(r=RANK, lora_alpha=16,
                                                target_modules=list(MODULES)))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    tt, tg = torch.tensor(tokens), torch.tensor(targets)

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(tt).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tg.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run, lambda: None, None


def _rounds(contenders: dict) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for run, _, _ in contenders.values():   # warm-up: compiles, first-touch pages
        run()
    for _ in range(ROUNDS):
        for k, (run, _, _) in contenders.items():
            time.sleep(PAUSE_S)
            t = time.perf_counter()
            run()
            times[k].append((time.perf_counter() - t) * 1e3)
    return times


def test_lora_step_vs_peft_cpu(setup, figures):
    weights, tokens, targets, adapter = setup
    contenders = {"orion": _orion_step(weights, tokens, targets, adapter),
                  "peft fp32": _peft_step(weights, tokens, targets, False),
                  "peft bf16 autocast": _peft_step(weights, tokens, targets, True)}
    try:
        times = _rounds(contenders)
    finally:
        for _, close, _ in contenders.values():
            close()
    toks = BATCH * SEQ
    best = {k: min(v) for k, v in times.items()}
    for k, v in times.items():
        figures.add(f"lora step, {k} (best / median of {ROUNDS})", best[k], "ms")
        figures.add(f"lora step, {k}, median", statistics.median(v), "ms")
        figures.add(f"lora step, {k}, tokens/s (best)", toks / best[k] * 1e3, "tok/s")
    host = contenders["orion"][2][1:]
    figures.add("lora step, orion host A/B grads + AdamW + input writes, median",
                statistics.median(h[0] for h in host), "ms")
    figures.add("lora step, orion host head (norm, classifier, loss, backward), median",
                statistics.median(h[1] for h in host), "ms")
    figures.ratio("lora step time, orion / peft fp32 (best)", best["orion"], best["peft fp32"],
                  "lower")
    figures.ratio("lora step time, orion / peft bf16 autocast (best)", best["orion"],
                  best["peft bf16 autocast"], "lower")
    assert all(np.isfinite(v).all() for v in times.values())


def test_no_adapter_cost_zero_rank_vs_inputs_held_at_zero(setup, figures):
    from orion.models.adapters import Adapter
    from orion.models.runtime import TransformerLM
    from orion.models.weights import ArrayWeights

    weights, _, _, adapter = setup
    zero = Adapter(adapter.config, ARCH,
                   {k: (a, np.zeros_like(b)) for k, (a, b) in adapter.matrices.items()})
    model = TransformerLM(ARCH, ArrayWeights(weights), None)
    model.adapters.add(zero, "zero")
    model.adapters.add(adapter, "real")
    ids = list(range(1, SEQ + 1))

    def prefill(name):
        def run() -> None:
            model.set_adapter(name)
            model.prefill(ids)
        return run, lambda: None, None

    try:
        times = _rounds({"base programs (no adapter)": prefill(None),
                         "lora programs, inputs at zero": prefill("zero"),
                         "lora programs, adapter selected": prefill("real")})
    finally:
        model.close()
    for k, v in times.items():
        figures.add(f"prefill {SEQ} tokens, {k} (best)", min(v), "ms")
    figures.ratio("prefill, inputs at zero / zero-rank base programs (best)",
                  min(times["lora programs, inputs at zero"]),
                  min(times["base programs (no adapter)"]), "lower")


def test_decode_with_and_without_an_adapter(setup, figures):
    from orion.models.runtime import RuntimeOptions, TransformerLM
    from orion.models.weights import ArrayWeights

    weights, _, _, adapter = setup
    model = TransformerLM(ARCH, ArrayWeights(weights), None,
                          options=RuntimeOptions(prefill_buckets=(32,), decode_buckets=(128,)))
    model.adapters.add(adapter, "real")
    steps = 16
    times: dict[str, list[float]] = {"no adapter": [], "adapter selected": []}
    try:
        for rnd in range(ROUNDS + 1):          # round 0 warms up (compiles)
            for k, name in (("no adapter", None), ("adapter selected", "real")):
                model.set_adapter(name)
                model.prefill(list(range(1, 33)))
                time.sleep(PAUSE_S)
                t = time.perf_counter()
                for step in range(steps):
                    model.decode(5 + step)
                if rnd:
                    times[k].append((time.perf_counter() - t) * 1e3)
    finally:
        model.close()
    for k, v in times.items():
        figures.add(f"decode tok/s after a 32-token prompt, {k} (best)",
                    steps / (min(v) / 1e3), "tok/s")
    assert all(np.isfinite(v).all() for v in times.values())
