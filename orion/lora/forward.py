"""A Llama model's forward pass with a LoRA adapter selected.

The adapter's A and B' are inputs of the forward kinds of the training programs
(`llama_programs.build_layer_graph(..., mode "inputs", lora)`), so selecting another
adapter of the same signature, or going back to one seen before, compiles nothing and
reloads nothing. These programs have no KV cache: each step runs the whole sequence
in the smallest bucket that holds it. The base model (no adapter selected) keeps the
KV-cache prefill and decode programs of `orion.models.llama`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from orion.lora.graph import LoraSpec, Signature
from orion.lora.runtime import AdapterSet
from orion.models.base import ModelStats
from orion.models.llama_config import LlamaConfig


class _ForwardPrograms:
    """The forward kinds of the training programs for one bucket, weights as inputs."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray], seq: int,
                 backend: str | None, lora: LoraSpec | None) -> None:
        from orion.models.llama_programs import build_layer_graph
        from orion.train.runner import GraphRunner
        from orion.train.update import instance_tag

        self.runners: dict[str, Any] = {}
        self.feeds: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        tag = instance_tag()
        try:
            for kind in ("attn_fwd", "ffn_fwd"):
                for layer in range(cfg.n_layers):
                    lg = build_layer_graph(kind, cfg, weights, layer, seq, "inputs", tag, lora)
                    if kind not in self.runners:
                        self.runners[kind] = GraphRunner(lg.graph, backend)
                    self.feeds[kind, layer] = {s.name: s.value(weights, cfg).astype(np.float16)
                                               for s in lg.slots}
        except BaseException:
            self.release()
            raise
        self.compiles = sum(r.compiles for r in self.runners.values())

    def run(self, kind: str, layer: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runners[kind].run({**feeds, **self.feeds[kind, layer]})

    def release(self) -> None:
        for r in self.runners.values():
            r.release()
        self.runners.clear()


class AdaptedForward:
    """Prefill and decode of a model whose selected adapter is `adapters.active`."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray],
                 adapters: AdapterSet, buckets: Sequence[int], backend: str | None,
                 stats: ModelStats,
                 embed: Callable[[Sequence[int]], np.ndarray],
                 host_logits: Callable[[np.ndarray], np.ndarray]) -> None:
        self.cfg, self.weights, self.adapters = cfg, weights, adapters
        self.buckets = sorted(buckets)
        self.backend, self.stats = backend, stats
        self._embed, self._host_logits = embed, host_logits
        self._programs: dict[tuple[int, Signature], _ForwardPrograms] = {}
        self.ids: list[int] = []
        self.adapter: str | None = None   # the adapter `ids` were run with

    def _layer_programs(self, seq: int) -> _ForwardPrograms:
        key = (seq, self.adapters.signature)
        lp = self._programs.get(key)
        if lp is not None:
            self.stats.cache_hits += 1
            return lp
        t0 = time.perf_counter()
        lp = _ForwardPrograms(self.cfg, self.weights, seq, self.backend, LoraSpec(key[1]))
        self.stats.compile_ms += (time.perf_counter() - t0) * 1e3
        self.stats.programs_compiled += lp.compiles
        self._programs[key] = lp
        return lp

    def _logits(self, positions: slice) -> np.ndarray:
        n = len(self.ids)
        seq = next((b for b in self.buckets if b >= n), None)
        if seq is None:
            raise ValueError(f"{n} tokens exceed the model's {self.buckets[-1]}")
        lp = self._layer_programs(seq)
        x = np.zeros((seq, self.cfg.dim), np.float32)
        x[:n] = self._embed(self.ids)
        h = np.ascontiguousarray(x.T)[None, :, None, :]
        for i in range(self.cfg.n_layers):
            a = lp.run("attn_fwd", i, {"x": h, **self.adapters.feeds(i, "attn_fwd")})
            h = lp.run("ffn_fwd", i, {"h": a["h"], **self.adapters.feeds(i, "ffn_fwd")})["y"]
        hidden = h.reshape(self.cfg.dim, seq).T[:n][positions]
        return self._host_logits(np.asarray(hidden, np.float32))

    def prefill(self, ids: Sequence[int], all_logits: bool) -> np.ndarray:
        t0 = time.perf_counter()
        self.ids = [int(i) for i in ids]
        self.adapter = self.adapters.active
        out = self._logits(slice(None) if all_logits else slice(-1, None))
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += len(self.ids)
        self.stats.prefill_ms += (time.perf_counter() - t0) * 1e3
        return out if all_logits else out[0]

    def decode(self, token: int) -> np.ndarray:
        if self.adapter != self.adapters.active:
            raise ValueError(f"the sequence was started with adapter {self.adapter!r}, now "
                             f"{self.adapters.active!r} is selected: prefill again")
        t0 = time.perf_counter()
        self.ids.append(int(token))
        out = self._logits(slice(-1, None))[0]
        self.stats.decode_calls += 1
        self.stats.decode_ms += (time.perf_counter() - t0) * 1e3
        return out

    def release(self) -> None:
        for lp in self._programs.values():
            lp.release()
        self._programs.clear()
