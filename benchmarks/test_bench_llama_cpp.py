"""GPT-2 small in one run: Orion on vane, llama.cpp f16 and PyTorch bf16 / fp32.

The peers read the same random weights (transformers' init of GPT-2 small, saved once;
llama.cpp gets them as a GGUF written by `gguf_gpt2.py`). Each peer runs in its own
process (`gpt2_peers.py` says why) and the rounds are interleaved, so a busy machine
slows every peer alike: decode is the best round of 128 greedy tokens after a 16-token
prompt, prefill the median of the rounds' 128-token prompts (last-row logits), all at 2
threads. Beside them the read-bandwidth bound of fp16 decode: weight bytes per token
over the read bandwidth measured in the same run. Figures are printed, never asserted;
what is asserted is that llama.cpp computes the same model (its logits against PyTorch
fp32), so that the ratios compare like with like.

llama-cpp-python builds llama.cpp from source (10-30 minutes on 2 cores): run
`benchmarks/build_llama_cpp.sh` once; until then this benchmark skips and says so.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import THREADS
from gguf_gpt2 import write_gpt2_gguf
from gpt2_peers import PeerProcess
from test_bench_gpt2 import (
    DECODE_TOKENS,
    PROMPT_DECODE,
    PROMPT_PREFILL,
    prompt,
    read_bandwidth,
    weight_bytes_per_token,
)

torch = pytest.importorskip("torch", reason="the PyTorch peer is a test-only dependency")
transformers = pytest.importorskip("transformers", reason="the PyTorch peer runs HF GPT-2")
pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed: run benchmarks/build_llama_cpp.sh "
    "once (it builds llama.cpp from source; the `bench` extra)")
pytest.importorskip("gguf", reason="the GGUF writer is the `gguf` package (the `bench` extra)")

ROUNDS = 3
SETTLE_S = 2.0       # between peers: the last one's spinning threads go to sleep
NAMES = {"orion": "Orion on vane (fp16)", "llama.cpp": "llama.cpp f16",
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
    paths = {"orion": gpt2_dir, "llama.cpp": gguf_path, "torch-bf16": gpt2_dir,
             "torch-fp32": gpt2_dir}
    peers: dict[str, PeerProcess] = {}
    try:
        for kind, path in paths.items():
            peers[kind] = PeerProcess(kind, path, THREADS, PROMPT_PREFILL)
        # llama.cpp must compute the model PyTorch fp32 computes, or no ratio means much
        ids = prompt(PROMPT_PREFILL)
        ref = peers["torch-fp32"].call("logits", ids)
        theirs = peers["llama.cpp"].call("logits", ids)
        rel = float(np.linalg.norm(theirs - ref) / np.linalg.norm(ref))
        figures.add("[one run] llama.cpp f16 logits vs PyTorch fp32, relative L2 error", rel, "")
        assert rel < 0.05 and int(np.argmax(theirs)) == int(np.argmax(ref))

        for peer in peers.values():          # compile / warm up outside the timing
            peer.call("decode", prompt(PROMPT_DECODE), 2)
            peer.call("prefill", ids)
        prefill: dict[str, list[float]] = {k: [] for k in peers}
        decode = {k: float("inf") for k in peers}
        for _ in range(ROUNDS):
            for kind, peer in peers.items():
                time.sleep(SETTLE_S)
                prefill[kind].append(peer.call("prefill", prompt(PROMPT_PREFILL)))
                time.sleep(SETTLE_S)
                decode[kind] = min(decode[kind], peer.call("decode", prompt(PROMPT_DECODE),
                                                           DECODE_TOKENS))
    finally:
        for peer in peers.values():
            peer.close()

    time.sleep(SETTLE_S)
    reading = max(read_bandwidth(), read_bandwidth_threads(THREADS))
    bound = reading / weight_bytes_per_token(transformers.GPT2Config(), 2)
    tps = {k: DECODE_TOKENS / s for k, s in decode.items()}
    ms = {k: 1e3 * float(np.median(v)) for k, v in prefill.items()}
    for kind in peers:
        figures.add(f"[one run] decode, {NAMES[kind]}", tps[kind], "tok/s")
    for kind in peers:
        figures.add(f"[one run] prefill 128, {NAMES[kind]}", ms[kind], "ms")
    figures.ratio("[one run] decode tok/s, Orion / llama.cpp f16 (target >= 1.0x)",
                  tps["orion"], tps["llama.cpp"])
    figures.ratio("[one run] prefill ms, Orion / llama.cpp f16 (target <= 1.0x)",
                  ms["orion"], ms["llama.cpp"], better="lower")
    figures.ratio("[one run] prefill ms, Orion / PyTorch bf16 (moonshot <= 1.0x)",
                  ms["orion"], ms["torch-bf16"], better="lower")
    figures.add("[one run] read bandwidth (best of 1 and 2 threads, 256 MiB)", reading / 1e9,
                "GB/s")
    figures.add("[one run] fp16 decode bound: weight bytes / read bandwidth", bound, "tok/s")
    figures.add("[one run] Orion decode / that bound (moonshot >= 0.85)", tps["orion"] / bound,
                "x")
    figures.add("[one run] llama.cpp f16 decode / that bound", tps["llama.cpp"] / bound, "x")
