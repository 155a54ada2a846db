"""Decode runners for the one-table benchmarks (GPT-2, a Qwen3 shape), each in a process
of its own.

llama.cpp and PyTorch run OpenMP thread pools whose threads spin for a while after each
parallel region: in one shared process, llama.cpp decoded 21 tok/s right after a PyTorch
bf16 decode and 131 tok/s two seconds later. So every peer lives in its own process
(`PeerProcess`), the rounds are interleaved from the parent, and the parent lets the
machine settle between peers. A peer is built by name:

    orion            Orion on vane, fp16 (the HF folder; any architecture it reads)
    orion-no-warm    the same with vane's warm-up off
    orion-baseline   Orion from another source checkout (ORION_BASELINE names it; it
                     must hold its own build/liborion.so), to compare two versions
                     of Orion in one run
    llama.cpp        llama-cpp-python on an f16 GGUF of the same weights
    torch-bf16       HF transformers (AutoModelForCausalLM) on PyTorch CPU, bf16 weights
    torch-fp32       the same in fp32
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numpy as np

ORION_VARIANTS = {   # peer kind -> vane's warm-up on
    "orion": True,
    "orion-no-warm": False,   # what the warm-up buys, in the same run
}


class OrionRunner:
    def __init__(self, folder: Path, threads: int, warm: bool = True) -> None:
        from orion.runtime import set_compile_budget, set_num_threads, vane_warm

        try:
            from orion.models import load_model
        except ImportError:   # a baseline from before orion.models.load_model
            from orion.models.base import load_model

        set_num_threads(threads)
        set_compile_budget(1000)
        vane_warm(warm)
        self.model = load_model(folder, prefill_buckets=(32, 128), decode_buckets=(256,))
        self.prefill = self.model.prefill
        self.step = self.model.decode


class LlamaCppRunner:
    def __init__(self, gguf_path: Path, threads: int, batch: int) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=256, n_batch=batch,
                                   n_ubatch=batch, n_threads=threads, n_threads_batch=threads,
                                   logits_all=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _logits(self) -> np.ndarray:
        ptr = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return self._logits()

    def step(self, token: int) -> np.ndarray:
        self.llm.eval([token])
        return self._logits()


class TorchRunner:
    def __init__(self, folder: Path, threads: int, dtype: str) -> None:
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype)).eval()
        self.past: Any = None

    def _run(self, ids: list[list[int]], past: Any) -> np.ndarray:
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor(ids), past_key_values=past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self._run([ids], None)

    def step(self, token: int) -> np.ndarray:
        return self._run([[token]], self.past)


def import_baseline() -> None:
    """Makes `import orion` (in this fresh process) read the checkout ORION_BASELINE
    names, not the installed package: an editable install's finder is set aside."""
    import os
    import sys

    root = os.environ.get("ORION_BASELINE")
    if not root or not (Path(root) / "orion" / "__init__.py").is_file():
        raise ValueError("ORION_BASELINE must name an Orion source checkout")
    sys.meta_path[:] = [f for f in sys.meta_path
                        if "editable" not in type(f).__module__.lower()
                        and "skbc" not in type(f).__module__]
    sys.path.insert(0, root)
    for name in [m for m in sys.modules if m == "orion" or m.startswith("orion.")]:
        del sys.modules[name]


def make_runner(kind: str, path: Path, threads: int, batch: int) -> Any:
    if kind == "orion-baseline":
        import_baseline()
        return OrionRunner(path, threads, True)
    if kind in ORION_VARIANTS:
        return OrionRunner(path, threads, ORION_VARIANTS[kind])
    if kind == "llama.cpp":
        return LlamaCppRunner(path, threads, batch)
    if kind.startswith("torch-"):
        return TorchRunner(path, threads, {"bf16": "bfloat16", "fp32": "float32"}[kind[6:]])
    raise ValueError(f"unknown peer {kind!r}")


def time_prefill(runner: Any, ids: list[int]) -> float:
    t = time.perf_counter()
    runner.prefill(ids)
    return time.perf_counter() - t


def time_decode(runner: Any, ids: list[int], tokens: int) -> float:
    """Seconds for `tokens` greedy steps after prefilling `ids`."""
    token = int(np.argmax(runner.prefill(ids)))
    t = time.perf_counter()
    for _ in range(tokens):
        token = int(np.argmax(runner.step(token)))
    return time.perf_counter() - t


def _serve(kind: str, path: Path, threads: int, batch: int, conn: Any) -> None:
    try:
        runner = make_runner(kind, path, threads, batch)
        conn.send(("ok", None))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        cmd, *args = conn.recv()
        if cmd == "close":
            return
        if cmd == "logits":
            conn.send(("ok", runner.prefill(args[0])))
        elif cmd == "prefill":
            conn.send(("ok", time_prefill(runner, args[0])))
        elif cmd == "decode":
            conn.send(("ok", time_decode(runner, args[0], args[1])))
        elif cmd == "rss":        # this process's peak resident set, in bytes: VmHWM,
            # not getrusage's ru_maxrss, which a spawned child inherits from its parent
            # across exec (every peer reported the pytest process's peak)
            with open("/proc/self/status") as f:
                kib = next(line.split()[1] for line in f if line.startswith("VmHWM"))
            conn.send(("ok", int(kib) * 1024))


class PeerProcess:
    """One peer in a spawned process; calls block until the child answers."""

    def __init__(self, kind: str, path: Path, threads: int, batch: int) -> None:
        self.kind = kind
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(kind, path, threads, batch, child),
                                daemon=True)
        self.proc.start()
        self._answer()

    def _answer(self) -> Any:
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.kind}: {value}")
        return value

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self._answer()

    def close(self) -> None:
        try:
            self.conn.send(("close",))
        except OSError:
            pass
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def interleaved_rounds(peers: dict[str, PeerProcess], make_prompt: Any, prefill_len: int,
                       decode_len: int, decode_tokens: int, rounds: int, settle_s: float,
                       label: str = "") -> tuple[dict[str, float], dict[str, float]]:
    """Times every peer `rounds` times, each round starting at another peer (none always
    follows the same one), settling between peers. Returns (decode tok/s, best round;
    prefill ms, median round) by peer."""
    ids = make_prompt(prefill_len)
    for peer in peers.values():          # compile and warm up outside the timing
        peer.call("decode", make_prompt(decode_len), 2)
        peer.call("prefill", ids)
    prefill: dict[str, list[float]] = {k: [] for k in peers}
    decode = {k: float("inf") for k in peers}
    order = list(peers.items())
    for r in range(rounds):
        if label:
            print(f"{label}: round {r + 1} of {rounds}", flush=True)
        for kind, peer in order[r % len(order):] + order[: r % len(order)]:
            time.sleep(settle_s)
            prefill[kind].append(peer.call("prefill", make_prompt(prefill_len)))
            time.sleep(settle_s)
            decode[kind] = min(decode[kind], peer.call("decode", make_prompt(decode_len),
                                                       decode_tokens))
    tps = {k: decode_tokens / s for k, s in decode.items()}
    return tps, {k: 1e3 * float(np.median(v)) for k, v in prefill.items()}
