"""One rank of tests/train/test_distributed.py: runs collectives through
`orion.train.distributed` / `orion.train.parallel` and prints a JSON result line."""

from __future__ import annotations

import json
import sys

import numpy as np

from orion.train.distributed import DistributedError, init, reduce_error_bound
from orion.train.parallel import DataParallel


def rank_values(rank: int, n: int) -> np.ndarray:
    """Gradients-like values spanning magnitudes 1e-9..1, both signs, per rank."""
    rng = np.random.default_rng(100 + rank)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-9, 0, n)).astype(np.float32)


def main() -> None:
    mode = sys.argv[1]
    group = init(timeout_s=60)
    assert group is not None
    result: dict = {"rank": group.rank}
    if mode == "reduce":
        every = [rank_values(r, 200_000) for r in range(group.size)]
        mine = every[group.rank]
        exact = np.sum([e.astype(np.float64) for e in every], axis=0)
        abs_sum = np.sum([np.abs(e.astype(np.float64)) for e in every], axis=0)
        summed = group.all_sum(mine.copy(), "test", "float32")
        result["float32_bit_exact"] = bool(
            group.size == 2 and np.array_equal(summed, every[0] + every[1]))
        for dtype in ("bfloat16", "float16"):
            got = group.all_sum(mine.copy(), "test", dtype).astype(np.float64)
            err = np.abs(got - exact)
            result[dtype] = float(np.max(err / reduce_error_bound(dtype, group.size, abs_sum)))
    elif mode == "fail":
        parallel = DataParallel(group)
        if group.rank == 1:
            parallel.fail(grad_accum=1)
        else:
            try:
                parallel.share([1.0], False, None, grad_accum=1)
            except DistributedError as exc:
                result["error"] = str(exc)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
