"""One rank of benchmarks/test_bench_distributed.py: times the gradient all-reduce of
`DataParallel.sum_grads` (all_sum on MLX's CPU stream, one per tensor) for gradients the
size of Stories110M's and of a LoRA adapter's, and prints rank 0's figures as JSON."""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from orion.models.llama_config import LlamaConfig
from orion.models.llama_weights import init_weights
from orion.train.distributed import init
from orion.train.parallel import DataParallel

STORIES110M = LlamaConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, vocab_size=32000,
                          hidden_dim=2048, max_seq_len=256)
LORA_RANK = 8       # adapters on q, k, v, o of every layer: A [r, dim] and B [dim, r]
REPEATS = 3


def lora_grads(cfg: LlamaConfig, r: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"layers.{i}.{p}.lora_{ab}": rng.standard_normal(shape).astype(np.float32)
            for i in range(cfg.n_layers) for p in ("q", "k", "v", "o")
            for ab, shape in (("A", (r, cfg.dim)), ("B", (cfg.dim, r)))}


def main() -> None:
    group = init(timeout_s=600)
    assert group is not None
    result = {"world": group.size}
    # the small payload first, and the variants in turns, round after round: the
    # machine's load drifts from minute to minute
    for name, make in (("lora_r8", lambda: lora_grads(STORIES110M, LORA_RANK)),
                       ("stories110m", lambda: init_weights(STORIES110M, 0))):
        grads = make()
        flat = np.ones(sum(g.size for g in grads.values()), np.float32)
        parallel = {d: DataParallel(group, d) for d in ("float32", "bfloat16")}
        times: dict[str, list[float]] = {"float32": [], "bfloat16": [], "one_buffer": []}
        for _ in range(REPEATS + 1):        # the first round warms the buffers up
            for dtype, p in parallel.items():
                p.sum_grads(grads)
                times[dtype].append(p.reduce_ms)
            t0 = time.perf_counter()        # the same bytes as one buffer, one collective
            group.all_sum(flat, "benchmark")
            times["one_buffer"].append((time.perf_counter() - t0) * 1e3)
        for key, ts in times.items():
            result[f"{name}_{key}_ms"] = statistics.median(ts[1:])
        for dtype, p in parallel.items():
            result[f"{name}_{dtype}_bytes"] = p.reduce_bytes
        del grads, flat
    if group.rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
