"""GPT-2 small, and a Qwen3-0.6B shape (issue 18: "also on the Qwen3-0.6B shape"), each
in one run: Orion on vane, llama.cpp f16 and PyTorch bf16 / fp32.

The peers read the same random weights (transformers' init of GPT-2 small, saved once;
numpy's of Qwen3-0.6B's published config in bf16; llama.cpp gets them as a GGUF written
by `gguf_gpt2.py` / `gguf_qwen3.py`). Each peer runs in its own process
(`decode_peers.py` says why) and the rounds are interleaved, each starting at another
peer, so a busy machine slows every peer alike and none always runs in the same place:
decode is the best of five rounds of 128 greedy tokens after a 16-token
prompt, prefill the median of the rounds' 128-token prompts (last-row logits), all at 2
threads. Beside them the read-bandwidth bound of fp16 decode: weight bytes per token
over the read bandwidth measured in the same run. Figures are printed, never asserted;
what is asserted is that llama.cpp computes the same model (its logits against PyTorch
fp32), so that the ratios compare like with like.

llama-cpp-python builds llama.cpp from source (10-30 minutes on 2 cores): run
`benchmarks/build_llama_cpp.sh` once; until then this benchmark skips and says so.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS
from decode_peers import PeerProcess, interleaved_rounds
from gguf_gpt2 import write_gpt2_gguf
from gguf_qwen3 import write_qwen3_gguf
from test_bench_gpt2 import (
    DECODE_TOKENS,
    PROMPT_DECODE,
    PROMPT_PREFILL,
    prompt,
    read_bandwidth,
    weight_bytes_per_token,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from asset_paths import require_asset  # noqa: E402
from models.hf_fixtures import PUBLISHED, save_numpy_init  # noqa: E402

torch = pytest.importorskip("torch", reason="the PyTorch peer is a test-only dependency")
transformers = pytest.importorskip("transformers", reason="the PyTorch peer runs HF GPT-2")
pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed: run benchmarks/build_llama_cpp.sh "
    "once (it builds llama.cpp from source; the `bench` extra)")
pytest.importorskip("gguf", reason="the GGUF writer is the `gguf` package (the `bench` extra)")

ROUNDS = 5          # best of: this machine is shared, and 3 left 5-10% swings between runs
SETTLE_S = 2.0       # between peers: the last one's spinning threads go to sleep
NAMES = {"orion": "Orion on vane (fp16)",
         "orion-no-warm": "Orion, warm-up off",
         "llama.cpp": "llama.cpp f16",
         "torch-bf16": "PyTorch bf16", "torch-fp32": "PyTorch fp32"}


def read_bandwidth_threads(threads: int) -> float:
    """Bytes per second `threads` PyTorch threads read summing 256 MiB."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.ones(64 * 2**20)
        a.sum()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            a.sum()
            best = min(best, time.perf_counter() - t)
        return a.numel() * 4 / best
    finally:
        torch.set_num_threads(old)


def test_gpt2_small_orion_llama_cpp_pytorch_one_table(gpt2_dir, figures, tmp_path):
    gguf_path = write_gpt2_gguf(gpt2_dir, tmp_path / "gpt2-f16.gguf")
    # beside Orion, Orion with vane's warm-up off: what it buys, in the same run
    one_table(figures, "[one run]", {"orion": gpt2_dir, "orion-no-warm": gpt2_dir,
                                     "llama.cpp": gguf_path,
                                     "torch-bf16": gpt2_dir, "torch-fp32": gpt2_dir},
              weight_bytes_per_token(transformers.GPT2Config(), 2), prompt, DECODE_TOKENS)


QWEN3_DECODE_TOKENS = 64     # 28 layers: four peers x five rounds stay within ~6 minutes


def test_qwen3_shape_orion_llama_cpp_pytorch_one_table(figures, tmp_path):
    """Qwen3-0.6B's published config, all 28 layers, random bf16 weights."""
    from orion.models.registry import architecture_from_config

    config = PUBLISHED["Qwen3-0.6B"]
    folder = save_numpy_init(tmp_path / "qwen3-0.6b", config)
    for f in require_asset("tokenizers/qwen2").iterdir():   # the GGUF's vocabulary
        shutil.copy(f, folder / f.name)
    gguf_path = write_qwen3_gguf(folder, tmp_path / "qwen3-f16.gguf")
    arch = architecture_from_config(config, "Qwen3-0.6B")   # tied: the classifier, once
    weight_bytes = 2 * sum(int(np.prod(s)) for s in arch.parameters().values())

    def qwen3_prompt(n: int) -> list[int]:
        return [int(i) for i in np.random.default_rng(n).integers(0, config["vocab_size"], n)]

    one_table(figures, "[qwen3 one run]", {"orion": folder, "llama.cpp": gguf_path,
                                           "torch-bf16": folder, "torch-fp32": folder},
              weight_bytes, qwen3_prompt, QWEN3_DECODE_TOKENS)


def one_table(figures, label: str, paths: dict, bytes_per_token: int, make_prompt,
              decode_tokens: int) -> None:
    """The peers on the same weights, rounds interleaved (and rotated); adds the figures."""
    peers: dict[str, PeerProcess] = {}
    try:
        for kind, path in paths.items():
            peers[kind] = PeerProcess(kind, path, THREADS, PROMPT_PREFILL)
        # llama.cpp must compute the model PyTorch fp32 computes, or no ratio means much
        ids = make_prompt(PROMPT_PREFILL)
        ref = peers["torch-fp32"].call("logits", ids)
        theirs = peers["llama.cpp"].call("logits", ids)
        rel = float(np.linalg.norm(theirs - ref) / np.linalg.norm(ref))
        figures.add(f"{label} llama.cpp f16 logits vs PyTorch fp32, relative L2 error", rel, "")
        assert rel < 0.05 and int(np.argmax(theirs)) == int(np.argmax(ref))

        tps, ms = interleaved_rounds(peers, make_prompt, PROMPT_PREFILL, PROMPT_DECODE,
                                     decode_tokens, ROUNDS, SETTLE_S, label=label)
    finally:
        for peer in peers.values():
            peer.close()

    time.sleep(SETTLE_S)
    reading = max(read_bandwidth(), read_bandwidth_threads(THREADS))
    bound = reading / bytes_per_token
    for kind in peers:
        figures.add(f"{label} decode, {NAMES[kind]}", tps[kind], "tok/s")
    for kind in peers:
        figures.add(f"{label} prefill 128, {NAMES[kind]}", ms[kind], "ms")
    figures.ratio(f"{label} decode tok/s, Orion / llama.cpp f16 (target >= 1.0x)",
                  tps["orion"], tps["llama.cpp"])
    if "orion-no-warm" in tps:
        figures.ratio(f"{label} decode tok/s, {NAMES['orion-no-warm']} / llama.cpp f16",
                      tps["orion-no-warm"], tps["llama.cpp"])
    figures.ratio(f"{label} prefill ms, Orion / llama.cpp f16 (target <= 1.0x)",
                  ms["orion"], ms["llama.cpp"], better="lower")
    figures.ratio(f"{label} prefill ms, Orion / PyTorch bf16 (moonshot <= 1.0x)",
                  ms["orion"], ms["torch-bf16"], better="lower")
    figures.add(f"{label} read bandwidth (best of 1 and 2 threads, 256 MiB)", reading / 1e9,
                "GB/s")
    figures.add(f"{label} fp16 decode bound: weight bytes / read bandwidth", bound, "tok/s")
    figures.add(f"{label} Orion decode / that bound (moonshot >= 0.85)", tps["orion"] / bound,
                "x")
    figures.add(f"{label} llama.cpp f16 decode / that bound", tps["llama.cpp"] / bound, "x")
