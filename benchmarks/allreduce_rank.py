"""One rank of benchmarks/test_bench_distributed.py: times the gradient all-reduce of
`DataParallel.sum_grads` (all_sum on MLX's CPU stream, one per tensor) for gradients the
size of Stories110M's and of a LoRA adapter's, and prints rank 0's figures as JSON."""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from orion.models.weights import init_weights
from orion.train.config import architecture_of
from orion.train.distributed import Group, init
from orion.train.parallel import DataParallel

STORIES110M = architecture_of({"dim": 768, "n_layers": 12, "n_heads": 12, "n_kv_heads": 12,
                               "vocab_size": 32000, "hidden_dim": 2048, "max_seq_len": 256},
                              "stories110M")
LORA_RANK = 8       # adapters on q, k, v, o of every layer: A [r, dim] and B [dim, r]
REPEATS = 4


def lora_grads(arch: object, r: int) -> dict[str, np.ndarray]:
    cfg = arch.args  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    return {f"layers.{i}.{p}.lora_{ab}": rng.standard_normal(shape).astype(np.float32)
            for i in range(cfg.n_layers) for p in ("q", "k", "v", "o")
            for ab, shape in (("A", (r, cfg.dim)), ("B", (cfg.dim, r)))}


def measure(group: Group, grads: dict[str, np.ndarray]) -> dict[str, float]:
    """Median ms of sum_grads in fp32 and bf16 and of the same bytes as one buffer (one
    collective); fp32 and one buffer in turns: the machine's load drifts."""
    flat = np.ones(sum(g.size for g in grads.values()), np.float32)
    parallel = {d: DataParallel(group, d) for d in ("float32", "bfloat16")}

    def one_buffer() -> float:
        t0 = time.perf_counter()
        group.all_sum(flat, "benchmark")
        return (time.perf_counter() - t0) * 1e3

    def bucketed(dtype: str) -> float:
        t0 = time.perf_counter()
        parallel[dtype].sum_grads(grads)
        return (time.perf_counter() - t0) * 1e3

    # fp32 and one buffer in turns; bf16 on its own after them (alternated with fp32 it
    # slowed both: MLX's allocator trades buffers of two sizes back and forth)
    times: dict[str, list[float]] = {"float32": [], "one_buffer": [], "bfloat16": []}
    for round_ in range(REPEATS + 1):       # the first round warms the buffers up
        for key in (("float32", "one_buffer") if round_ % 2 else ("one_buffer", "float32")):
            times[key].append(bucketed(key) if key == "float32" else one_buffer())
    for _ in range(REPEATS + 1):
        times["bfloat16"].append(bucketed("bfloat16"))
    out = {f"{k}_ms": statistics.median(ts[1:]) for k, ts in times.items()}
    out.update({f"{d}_bytes": p.reduce_bytes for d, p in parallel.items()})
    return out


def main() -> None:
    group = init(timeout_s=600)
    assert group is not None
    result = {"world": group.size}
    # the small payload first; each payload freed before the next is made
    for name, make in (("lora_r8", lambda: lora_grads(STORIES110M, LORA_RANK)),
                       ("stories110m", lambda: init_weights(STORIES110M, 0))):
        result.update({f"{name}_{k}": v for k, v in measure(group, make()).items()})
    if group.rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
