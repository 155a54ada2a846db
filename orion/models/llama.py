"""Llama as an Orion `CausalLM`, and its loaders for `orion.load`.

The forward runs on the backend with the same per-layer programs training uses
(`attn_fwd`, `ffn_fwd` of `orion.models.llama_programs`, weights as program inputs, so
one program per kind and sequence bucket serves every layer); embedding, final norm
and classifier run on the host. There is no KV-cache program yet: the cache is the
token history, and `decode` re-runs the causal forward over the smallest bucket that
holds it (positions past the end cannot affect earlier ones). That is exact, and
fast enough for the small models Orion trains; a cached decode program is the next
step for large ones.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orion.lora.graph import LoraSpec
from orion.lora.runtime import AdapterSet
from orion.models.base import ModelLoadError, ModelStats, Tokenizer
from orion.models.llama_config import LlamaConfig
from orion.models.llama_reference import rms_norm
from orion.models.llama_weights import EMBED, FINAL_NORM, Weights, classifier, load_hf

BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096)


class LlamaLM:
    """A Llama model on a backend (see the module docstring)."""

    def __init__(self, config: LlamaConfig, weights: Weights, tokenizer: Tokenizer, *,
                 backend: str | None = None) -> None:
        self.config, self.weights, self.tokenizer = config, weights, tokenizer
        self.stats = ModelStats()
        self._backend = backend or "vane"
        self._programs: dict[tuple[int, Any], Any] = {}   # (bucket, LoRA signature) -> programs
        self.adapters = AdapterSet(config)    # LoRA adapters, selected per call (orion.lora)
        self._ids: list[int] = []
        self._closed = False
        self.buckets = [b for b in BUCKETS if b < config.max_seq_len] + [config.max_seq_len]

    @property
    def position(self) -> int:
        return len(self._ids)

    @property
    def max_length(self) -> int:
        return self.config.max_seq_len

    @property
    def backend(self) -> str:
        return self._backend

    def load_adapter(self, path: str | Path, name: str = "default") -> None:
        """Loads a PEFT LoRA adapter folder beside the others (it is not selected)."""
        self.adapters.load(path, name)

    def set_adapter(self, name: str | None) -> None:
        """Selects a loaded adapter, or None for the base model: no compile, no reload."""
        self.adapters.select(name)

    def _layer_programs(self, seq: int) -> Any:
        if self._closed:
            raise ValueError("model was closed")
        key = (seq, self.adapters.signature)
        lp = self._programs.get(key)
        if lp is not None:
            self.stats.cache_hits += 1
            return lp
        t0 = time.perf_counter()
        lp = _ForwardPrograms(self.config, self.weights, seq, self._backend,
                              LoraSpec(key[1]) if key[1] else None)
        self.stats.compile_ms += (time.perf_counter() - t0) * 1e3
        self.stats.programs_compiled += lp.compiles
        self._programs[key] = lp
        return lp

    def _logits(self, ids: Sequence[int], positions: slice) -> np.ndarray:
        n = len(ids)
        if n == 0:
            raise ValueError("no tokens to run")
        if n > self.max_length:
            raise ValueError(f"{n} tokens exceed the model's {self.max_length}")
        seq = next(b for b in self.buckets if b >= n)
        lp = self._layer_programs(seq)
        x = np.zeros((seq, self.config.dim), np.float32)
        x[:n] = self.weights[EMBED][np.asarray(ids)]
        h = np.ascontiguousarray(x.T)[None, :, None, :]
        for i in range(self.config.n_layers):
            a = lp.run("attn_fwd", i, {"x": h, **self.adapters.feeds(i, "attn_fwd")})
            h = lp.run("ffn_fwd", i, {"h": a["h"], **self.adapters.feeds(i, "ffn_fwd")})["y"]
        xf = h.reshape(self.config.dim, seq).T[:n][positions]
        xfn, _ = rms_norm(xf, self.weights[FINAL_NORM], self.config.norm_eps)
        return (xfn @ classifier(self.weights, self.config).T).astype(np.float32)

    def prefill(self, ids: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        t0 = time.perf_counter()
        self._ids = [int(i) for i in ids]
        out = self._logits(self._ids, slice(None) if all_logits else slice(-1, None))
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += len(self._ids)
        self.stats.prefill_ms += (time.perf_counter() - t0) * 1e3
        return out if all_logits else out[0]

    def decode(self, token: int) -> np.ndarray:
        t0 = time.perf_counter()
        if self.position >= self.max_length:
            raise ValueError(f"the cache is full ({self.max_length} tokens)")
        self._ids.append(int(token))
        out = self._logits(self._ids, slice(-1, None))[0]
        self.stats.decode_calls += 1
        self.stats.decode_ms += (time.perf_counter() - t0) * 1e3
        return out

    def reset(self) -> None:
        self._ids = []

    def close(self) -> None:
        for lp in self._programs.values():
            lp.release()
        self._programs.clear()
        self._closed = True

    def __enter__(self) -> LlamaLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ForwardPrograms:
    """Only the forward kinds of the training programs, weights as inputs."""

    def __init__(self, cfg: LlamaConfig, weights: Weights, seq: int, backend: str,
                 lora: LoraSpec | None = None) -> None:
        from orion.models.llama_programs import build_layer_graph
        from orion.train.runner import GraphRunner
        from orion.train.update import instance_tag

        self.cfg = cfg
        self.runners: dict[str, Any] = {}
        self.feeds: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        tag = instance_tag()
        for kind in ("attn_fwd", "ffn_fwd"):
            for layer in range(cfg.n_layers):
                lg = build_layer_graph(kind, cfg, weights, layer, seq, "inputs", tag, lora)
                if kind not in self.runners:
                    self.runners[kind] = GraphRunner(lg.graph, backend)
                self.feeds[kind, layer] = {s.name: s.value(weights, cfg).astype(np.float16)
                                           for s in lg.slots}
        self.compiles = sum(r.compiles for r in self.runners.values())

    def run(self, kind: str, layer: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runners[kind].run({**feeds, **self.feeds[kind, layer]})

    def release(self) -> None:
        for r in self.runners.values():
            r.release()


def _tokenizer_for(folder: Path, vocab_size: int) -> Tokenizer:
    from orion.models.tokenizer_sp import SentencePieceTokenizer

    model = folder / "tokenizer.model"
    if not model.exists():
        raise ModelLoadError(f"{folder}: no tokenizer.model (a SentencePiece model)")
    tok = SentencePieceTokenizer(model)
    if tok.vocab_size != vocab_size:
        raise ModelLoadError(f"{model}: {tok.vocab_size} pieces, the model has {vocab_size}")
    return tok


def load_llama(path: Path, *, backend: str | None = None, tokenizer: Tokenizer | None = None,
               adapter_path: str | Path | None = None, **options: Any) -> LlamaLM:
    """A Hugging Face Llama folder (config.json, *.safetensors, tokenizer.model);
    `adapter_path`: a PEFT LoRA adapter folder, loaded as "default" and selected."""
    if options:
        raise ModelLoadError(f"unknown Llama options {sorted(options)}")
    cfg, weights = load_hf(path)
    model = LlamaLM(cfg, weights, tokenizer or _tokenizer_for(Path(path), cfg.vocab_size),
                    backend=backend)
    if adapter_path is not None:
        model.load_adapter(adapter_path)
        model.set_adapter("default")
    return model


def load_llama2c(path: Path, *, backend: str | None = None, tokenizer: Tokenizer | None = None,
                 adapter_path: str | Path | None = None, **options: Any) -> LlamaLM:
    """A llama2.c .bin checkpoint; the tokenizer is tokenizer.model beside it (Meta's
    Llama-2 vocabulary for the TinyStories models)."""
    from orion.models.llama2c import read_llama2c

    if options:
        raise ModelLoadError(f"unknown Llama options {sorted(options)}")
    cfg, weights = read_llama2c(path)
    model = LlamaLM(cfg, weights,
                    tokenizer or _tokenizer_for(Path(path).parent, cfg.vocab_size),
                    backend=backend)
    if adapter_path is not None:
        model.load_adapter(adapter_path)
        model.set_adapter("default")
    return model


def default_model_path() -> Path:
    """The model the package ships (orion/assets/shakespeare-llama): a small Llama
    trained on Shakespeare with Orion (docs/training.md has the command)."""
    return Path(__file__).resolve().parents[1] / "assets" / "shakespeare-llama"
