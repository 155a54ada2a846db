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
    payloads = {"stories110m": init_weights(STORIES110M, 0),
                "lora_r8": lora_grads(STORIES110M, LORA_RANK)}
    result = {"world": group.size}
    for name, grads in payloads.items():
        for dtype in ("float32", "bfloat16"):
            p = DataParallel(group, dtype)
            times = []
            for _ in range(REPEATS + 1):        # the first warms the buffers up
                p.sum_grads(grads)
                times.append(p.reduce_ms)
            result[f"{name}_{dtype}_ms"] = statistics.median(times[1:])
            result[f"{name}_{dtype}_bytes"] = p.reduce_bytes
        # the same bytes as one buffer (one collective instead of one per tensor)
        flat = np.ones(sum(g.size for g in grads.values()), np.float32)
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            group.all_sum(flat, "benchmark")
            times.append((time.perf_counter() - t0) * 1e3)
        result[f"{name}_one_buffer_ms"] = statistics.median(times)
    if group.rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
