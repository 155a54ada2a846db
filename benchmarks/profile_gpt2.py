"""Where vane's time goes in GPT-2 small: decode and 128-token prefill, per op kind.

    python benchmarks/profile_gpt2.py [--threads 2] [--tokens 64]

Builds GPT-2 small with transformers' random init (no download), runs it on vane with
step timing on (`orion.runtime.vane_profile`), and prints per op kind the steps, the
milliseconds per decoded token (or per prefill) and the share of the eval time. conv
and matmul are split into "gemv" (one live column) and "gemm". Wall time on a shared
machine: read the shares more than the absolute figures.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from orion.runtime import (
    OpTime,
    set_compile_budget,
    set_num_threads,
    vane_profile,
    vane_profile_read,
)


def random_gpt2(folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval().save_pretrained(
        folder, safe_serialization=True)


def table(title: str, rows: list[OpTime], per: int, wall: float) -> str:
    total = sum(r.seconds for r in rows)
    lines = [f"{title}: wall {1e3 * wall / per:.2f} ms, in vane steps "
             f"{1e3 * total / per:.2f} ms (per {'token' if per > 1 else 'run'})",
             f"  {'op':<18}{'steps':>8}{'ms':>10}{'share':>8}"]
    for r in rows:
        name = f"{r.op} ({r.shape})" if r.shape else r.op
        lines.append(f"  {name:<18}{r.steps // per:>8}{1e3 * r.seconds / per:>10.3f}"
                     f"{100 * r.seconds / total:>7.1f}%")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", type=Path, help="a GPT-2 folder (default: random GPT-2 small)")
    args = ap.parse_args()
    from orion.models import load_model as load_gpt2

    set_num_threads(args.threads)
    set_compile_budget(1000)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or Path(tmp)
        if args.model is None:
            random_gpt2(folder)
        model = load_gpt2(folder, prefill_buckets=(32, 128), decode_buckets=(256,))
        rng = np.random.default_rng(0)
        prompt = [int(i) for i in rng.integers(0, 50257, 128)]
        model.prefill(prompt)                     # compile outside the profile
        model.prefill(prompt[:16])
        model.decode(0)

        model.prefill(prompt[:16])
        vane_profile(True)
        token, t = 0, time.perf_counter()
        for _ in range(args.tokens):
            token = int(np.argmax(model.decode(token)))
        wall = time.perf_counter() - t
        print(table(f"decode ({args.tokens} tokens after 16)", vane_profile_read(),
                    args.tokens, wall))

        vane_profile(True)
        t = time.perf_counter()
        model.prefill(prompt)
        wall = time.perf_counter() - t
        print(table("prefill 128 (last-row logits)", vane_profile_read(), 1, wall))
        vane_profile(False)
        model.close()


if __name__ == "__main__":
    main()
