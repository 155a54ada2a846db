"""Orion on quantized weights agrees with the tools that made them: an MLX 4-bit folder
(mlx_lm.convert of a shrunk published config, random weights) with mlx-lm on CPU, and a
GGUF Q4_K_M (llama.cpp's own quantizer) with llama.cpp.

Both references compute differently from the device: mlx-lm's quantized matmul sums
s * (q . x) + b * sum(x) in fp32 (here the model cast to fp32), llama.cpp's K-quant
dot products quantize the activations to 8 bits; Orion holds each weight as the
device's op rounds it to fp16 (docs/quantization.md) and computes in fp16. So the
bound is wider than the fp16 tests' 8 ulps: every step's logits within ULPS_MLX (or
ULPS_LLAMA) fp16 ulps (2^-11 relative each) of the largest logit, and every greedy
token the reference's argmax, except where the reference's top two are nearer than
that bound (a near tie), which is stated and counted, never silently passed."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from models.hf_fixtures import save_hf_model

from orion.models import load_model
from quant.conftest import mlx_convert, small
from quant.gguf_writer import write_gguf

pytestmark = [pytest.mark.native, pytest.mark.slow]
PROMPT, GREEDY = 16, 32
ULPS_MLX = 16 * 2.0 ** -11
ULPS_LLAMA = 32 * 2.0 ** -11


def _orion_greedy(path, prompt):
    with load_model(path, prefill_buckets=(32,), decode_buckets=(64,)) as m:
        logits, tokens, steps = m.prefill(prompt), [], []
        steps.append(logits)
        for _ in range(GREEDY):
            tokens.append(int(np.argmax(logits)))
            logits = m.decode(tokens[-1])
            steps.append(logits)
    return tokens, np.stack(steps)


def _agree(ours, ref, tokens, bound):
    tol = bound * float(np.abs(ref).max())
    worst = float(np.abs(ours - ref).max())
    assert worst <= tol, f"max |orion - reference| = {worst:.5f} > {tol:.5f}"
    ties = 0
    for step, token in enumerate(tokens):
        best = int(np.argmax(ref[step]))
        if token != best:   # allowed only at a near tie, and counted
            assert ref[step][best] - ref[step][token] <= tol, (step, token, best)
            ties += 1
    assert ties <= 2, f"{ties} near ties in {len(tokens)} steps"
    # the measured figures, for docs/quantization.md (pytest -s shows them)
    print(f"max |orion - reference| {worst:.5f} of largest logit {tol / bound:.3f} "
          f"({worst / tol * bound / 2.0 ** -11:.1f} fp16 ulps; bound {tol:.5f}); "
          f"greedy: {len(tokens) - ties}/{len(tokens)} equal, {ties} near ties")


def _prompt():
    return [int(i) for i in np.random.default_rng(1).integers(0, 512, PROMPT)]


def test_mlx_4bit_folder_agrees_with_mlx_lm(tmp_path):
    mx = pytest.importorskip("mlx.core")
    load = pytest.importorskip("mlx_lm").load
    hf = save_hf_model(tmp_path / "hf", small("Qwen3-0.6B"))
    folder = mlx_convert(hf, tmp_path / "mlx4", bits=4, group=64)
    prompt = _prompt()
    tokens, ours = _orion_greedy(folder, prompt)
    model, _ = load(str(folder))
    model.set_dtype(mx.float32)     # its quantized matmuls in fp32: the exact s q + b
    ref = np.array(model(mx.array([prompt + tokens]))[0].astype(mx.float32))
    _agree(ours, ref[PROMPT - 1:], tokens, ULPS_MLX)


@pytest.mark.parametrize("name", ["Qwen3-0.6B", "Llama-3.2-1B"])
def test_gguf_q4_k_m_agrees_with_llama_cpp(name, tmp_path):
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed: this runs where "
        "benchmarks/build_llama_cpp.sh has built it (the bench extra)")
    hf = save_hf_model(tmp_path / "hf", small(name))
    f16 = write_gguf(hf, tmp_path / "f16.gguf", "F16")
    path = tmp_path / "q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(f16).encode(), str(path).encode(),
                                          ctypes.byref(params)) == 0
    prompt = _prompt()
    tokens, ours = _orion_greedy(path, prompt)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, logits_all=True, n_threads=2,
                          verbose=False)
    llm.eval(prompt + tokens)
    ref = np.array(llm.scores[: PROMPT + GREEDY], np.float32)
    _agree(ours, ref[PROMPT - 1:], tokens, ULPS_LLAMA)
