"""One LoRA micro-batch: the forward and activation-gradient programs on the device,
base weights baked and frozen, A and B as program inputs; the gradients of A and B on
the host, from the taps the step keeps anyway.

For an adapted layer y = W x + s B (A x), with dy the gradient at y:

    dB = s dy (A x)^T        [out, r]: two small products, O(r (in + out) S)
    dA = s (B^T dy) x^T      [r, in]

x and dy are what the full training step already uses for dW (orion.train.step):
xn / dq, dk, dv for q, k, v; att / dh for o; hn / dgate, dup for gate and up; m / dy
for down. Nothing of the base is patched or reloaded; after an optimizer step only
the LoRA inputs change (`write_adapter`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from orion import host_blas
from orion.lora.adapter import Adapter, module_shape, tensor_name
from orion.lora.graph import LoraSpec, Signature, layer_feeds, mask_name, signature
from orion.lora.runtime import kind_feeds
from orion.models import llama_reference as ref
from orion.models.llama_config import LlamaConfig
from orion.models.llama_programs import KINDS, reduce_kv
from orion.models.llama_weights import EMBED, FINAL_NORM, classifier
from orion.train.stability import SanitizeCounts, sanitize
from orion.train.step import _dev, _mat
from orion.train.update import LayerPrograms

Masks = dict[tuple[int, str], np.ndarray]   # (layer, module) -> dropout mask [in, S]


@dataclass
class LoraStepOutput:
    loss: float                     # mean over the micro-batch's loss tokens
    tokens: int                     # loss tokens in the micro-batch
    grads: dict[str, np.ndarray]    # PEFT tensor name -> gradient (of the summed loss
                                    # divided by `norm`)
    finite: bool = True


class LoraStep:
    """The layer programs of one model and sequence length, for one adapter layout."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray], adapter: Adapter,
                 seq: int, backend: str | None = None, loss_scale: float = 256.0,
                 dropout: float = 0.0, strategy: str | None = None) -> None:
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout {dropout} is not in [0, 1)")
        self.cfg, self.weights, self.seq, self.loss_scale = cfg, weights, seq, loss_scale
        self.dropout = dropout
        if (backend or "vane") == "vane":  # the device shares these cores: one thread pool
            host_blas.share()
        self.sig: Signature = signature(adapter)
        # The base is baked ("delta" programs, never patched) when the compile budget
        # holds 4 programs a layer; otherwise it is a program input staged once ("inputs",
        # 4 programs in all) and never rewritten either.
        self.strategy = strategy or self._strategy(backend)
        self.programs = LayerPrograms(cfg, weights, seq, self.strategy, backend,
                                      lora=LoraSpec(self.sig, dropout > 0))
        self.compiles = self.programs.compiles
        self.host_ms = 0.0     # A/B gradients on the host, cumulative
        self.head_ms = 0.0     # final norm, classifier, loss and their backward, cumulative
        self._lora: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self.write_adapter(adapter)

    def _strategy(self, backend: str | None) -> str:
        from orion.runtime import compile_budget, compile_count

        if backend == "reference":
            return "delta"
        left = compile_budget() - compile_count()
        return "delta" if len(KINDS) * self.cfg.n_layers <= left else "inputs"

    def write_adapter(self, adapter: Adapter) -> None:
        """The adapter's A and s B, in fp16, for the programs' LoRA inputs (copied into
        their surfaces by each run: a few KB a layer; the base is never touched)."""
        if signature(adapter) != self.sig:
            raise ValueError("the adapter's modules or ranks differ from the programs'")
        for layer in range(self.cfg.n_layers):
            feeds = layer_feeds(adapter, self.sig, layer, self.cfg)
            for kind in KINDS:
                self._lora[kind, layer] = kind_feeds(feeds, kind)

    def make_masks(self, rng: np.random.Generator) -> Masks:
        """One sequence's dropout masks, one per adapted (layer, module), [in, S]: 0 or
        1/(1-p) rounded to fp16 (the device multiplies by exactly these values)."""
        keep = np.float32(np.float16(1.0 / (1.0 - self.dropout)))
        out: Masks = {}
        for layer in range(self.cfg.n_layers):
            for module, _ in self.sig:
                inp = module_shape(self.cfg, module)[1]
                out[layer, module] = (rng.random((inp, self.seq)) >= self.dropout) * keep
        return out

    def _run(self, kind: str, layer: int, feeds: dict[str, np.ndarray],
             counts: SanitizeCounts, masks: Masks | None = None) -> dict[str, np.ndarray]:
        feeds = {**feeds, **self._lora[kind, layer]}
        if masks is not None:
            feeds.update(kind_feeds(
                {mask_name(m): masks[layer, m][None, :, None, :] for m, _ in self.sig}, kind))
        out = self.programs.run(kind, layer, feeds)
        return {k: sanitize(v, counts) for k, v in out.items()}

    def __call__(self, adapter: Adapter, tokens: np.ndarray, targets: np.ndarray,
                 mask: np.ndarray, norm: int | None = None, loss_only: bool = False,
                 dropout: Sequence[Masks] | np.random.Generator | None = None
                 ) -> LoraStepOutput:
        """Loss and A/B gradients of a micro-batch [B, S] (mask: 1 where a target counts).
        Gradients are of sum(token losses) / norm (default: this batch's loss tokens),
        so micro-batches of one optimizer step add up to its mean. `loss_only` skips
        the backward (validation, with no dropout). With dropout, `dropout` is one
        `make_masks` per sequence, or a generator to draw them from."""
        cfg, w = self.cfg, self.weights
        tokens, targets, mask = (np.atleast_2d(a) for a in (tokens, targets, mask))
        n_tok = int(mask.sum())
        norm = norm or max(n_tok, 1)
        grads = {k: np.zeros_like(v) for k, v in adapter.params().items()}
        counts = SanitizeCounts()
        cls = classifier(w, cfg)
        total = 0.0
        inv = 1.0 / self.loss_scale
        if self.dropout > 0 and isinstance(dropout, np.random.Generator):
            dropout = [self.make_masks(dropout) for _ in range(tokens.shape[0])]
        elif self.dropout > 0 and dropout is None:
            if not loss_only:
                raise ValueError("dropout > 0: give masks or a generator")
        for b in range(tokens.shape[0]):
            rows = np.flatnonzero(mask[b])
            if rows.size == 0:
                continue
            drop: Masks | None = None
            if self.dropout > 0:   # validation runs the programs with all-keep masks
                drop = dropout[b] if isinstance(dropout, Sequence) else self._keep_all()
            taps = []
            x = _dev(w[EMBED][tokens[b]])
            for i in range(cfg.n_layers):
                a = self._run("attn_fwd", i, {"x": x}, counts, drop)
                f = self._run("ffn_fwd", i, {"h": a["h"]}, counts, drop)
                taps.append({"x": x, **a, **{k: v for k, v in f.items() if k != "y"}})
                x = f["y"]
            t_head = time.perf_counter()
            xf = _mat(x).T                                          # [S, D]
            xfn, inv_f = ref.rms_norm(xf, w[FINAL_NORM], cfg.norm_eps)
            logits = xfn[rows] @ cls.T
            loss, dl = ref.cross_entropy(logits, targets[b][rows],
                                         self.loss_scale * rows.size / norm, in_place=True)
            if not np.isfinite(loss):
                return LoraStepOutput(float("nan"), n_tok, grads, finite=False)
            total += loss * rows.size
            if loss_only:
                self.head_ms += (time.perf_counter() - t_head) * 1e3
                continue
            dxfn = np.zeros_like(xf)
            dxfn[rows] = dl @ cls
            dxf, _ = ref.rms_norm_backward(dxfn, xf, w[FINAL_NORM], inv_f)
            dy = _dev(dxf)
            self.head_ms += (time.perf_counter() - t_head) * 1e3
            # every backward program before any A/B product: host BLAS threads spin
            # after a call and slow the device programs run between them (as in
            # orion.train.step)
            backward = []
            for i in reversed(range(cfg.n_layers)):
                t = taps[i]
                fb = self._run("ffn_bwd", i, {"dy": dy, "h": t["h"], "gate": t["gate"],
                                              "up": t["up"]}, counts, drop)
                ab = self._run("attn_bwd", i, {"dh": fb["dh"], "x": t["x"], "q": t["q"],
                                               "k": t["k"], "v": t["v"]}, counts, drop)
                backward.append((i, dy, fb, ab))
                dy = ab["dx"]
            t_host = time.perf_counter()
            for i, dy_i, fb, ab in backward:
                t = taps[i]
                pairs = {"q_proj": (t["xn"], ab["dq"]), "k_proj": (t["xn"], ab["dk"]),
                         "v_proj": (t["xn"], ab["dv"]), "o_proj": (t["att"], fb["dh"]),
                         "gate_proj": (t["hn"], fb["dgate"]), "up_proj": (t["hn"], fb["dup"]),
                         "down_proj": (t["m"], dy_i)}
                for module, _ in self.sig:
                    xin, dout = (_mat(v) for v in pairs[module])
                    if module in ("k_proj", "v_proj"):
                        dout = reduce_kv(dout, cfg)        # expanded rows summed per kv head
                    if drop is not None:
                        xin = xin * drop[i, module]
                    self._lora_grads(adapter, i, module, xin, dout * np.float32(inv), grads)
            self.host_ms += (time.perf_counter() - t_host) * 1e3
        return LoraStepOutput(total / max(n_tok, 1), n_tok, grads, not counts.overflow)

    def _keep_all(self) -> Masks:
        return {(i, m): np.ones((module_shape(self.cfg, m)[1], self.seq), np.float32)
                for i in range(self.cfg.n_layers) for m, _ in self.sig}

    @staticmethod
    def _lora_grads(adapter: Adapter, layer: int, module: str, x: np.ndarray, dy: np.ndarray,
                    grads: dict[str, np.ndarray]) -> None:
        """dB += s dy (A x)^T, dA += s (B^T dy) x^T, for x [in, S], dy [out, S]."""
        a, b = adapter.matrices[layer, module]
        s = np.float32(adapter.config.scale(layer, module))
        grads[tensor_name(layer, module, "B")] += s * (dy @ (a @ x).T)
        grads[tensor_name(layer, module, "A")] += s * ((b.T @ dy) @ x.T)

    def release(self) -> None:
        self.programs.release()
