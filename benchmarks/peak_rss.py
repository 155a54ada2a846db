"""Peak RSS of generation, the one definition the model benchmarks share.

A child process loads a model folder (`orion.models.load_model`, which picks the
loader by `model_type`, as `orion generate` does), prefills 16 tokens (bucket 32) and
decodes 8 (cache 256), then prints its peak RSS: the kernel's VmHWM, not getrusage's
RUSAGE_CHILDREN (a child started by vfork can report the parent's high-water mark).
The issue's budget is 1.3x the model's fp16 weight bytes plus its KV cache.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CACHE_ROWS = 256          # the decode bucket the child runs at
BUDGET = 1.3              # peak RSS / (fp16 weights + KV cache), issue 12

PEAK_SCRIPT = textwrap.dedent(f"""
    import sys
    import numpy as np
    from orion.models import load_model
    m = load_model(sys.argv[1], prefill_buckets=(32,), decode_buckets=({CACHE_ROWS},))
    logits = m.prefill(list(range(1, 17)))
    for _ in range(8):
        logits = m.decode(int(np.argmax(logits)))
    m.close()
    print(next(line.split()[1] for line in open("/proc/self/status")
               if line.startswith("VmHWM")))
""")


def peak_rss_bytes(folder: str | Path) -> int:
    """Peak RSS of a child that loads `folder`, prefills 16 tokens and decodes 8. (Not
    `orion generate` itself: a benchmark folder may have no tokenizer; the model work is
    the same.)"""
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(folder)], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return 1024 * int(out.stdout.split()[-1])


def kv_cache_bytes(n_layers: int, kv_dim: int) -> int:
    """fp16 keys and values of every layer at the child's cache length."""
    return 2 * 2 * n_layers * CACHE_ROWS * kv_dim
