"""One LoRA micro-batch: the block programs on the device (`orion.train.programs`),
the base weights baked and frozen, A and B' as program inputs; the gradients of A and B
on the host, from the taps the backward programs give (each adapted module's input,
after dropout, and the gradient at its output).

For an adapted layer y = W x + s B (A x), with dy the gradient at y:

    dB = s dy (A x)^T        [out, r]: two small products, O(r (in + out) S)
    dA = s (B^T dy) x^T      [r, in]

Nothing of the base is patched or reloaded; after an optimizer step only the LoRA
inputs change (`write_adapter`). Every architecture the loader reads trains here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from orion.errors import InvalidArgumentError, LoraError
from orion.models.adapters import Adapter, Signature, packed_matrix, signature
from orion.models.architecture import Architecture
from orion.models.frozen import FrozenWeights
from orion.models.weights import ArrayWeights
from orion.runtime import host_blas
from orion.train.loss import cross_entropy
from orion.train.programs import FINAL, LoraSpec, lora_names
from orion.train.stability import SanitizeCounts
from orion.train.step import BlockRunner, to_device
from orion.train.update import TrainPrograms

Masks = dict[tuple[int, str], np.ndarray]   # (layer, module) -> dropout mask [in, S]


@dataclass
class LoraStepOutput:
    loss: float                     # mean over the micro-batch's loss tokens
    tokens: int                     # loss tokens in the micro-batch
    grads: dict[str, np.ndarray]    # PEFT tensor name -> gradient (of the summed loss
                                    # divided by `norm`)
    finite: bool = True


class LoraStep:
    """The block programs of one model and sequence length, for one adapter layout."""

    def __init__(self, arch: Architecture, weights: Mapping[str, np.ndarray],
                 adapter: Adapter, seq: int, backend: str | None = None,
                 loss_scale: float = 256.0, dropout: float = 0.0,
                 strategy: str | None = None) -> None:
        if not 0.0 <= dropout < 1.0:
            raise LoraError(f"dropout {dropout} is not in [0, 1)")
        self.arch, self.weights, self.seq, self.loss_scale = arch, weights, seq, loss_scale
        self.dropout = dropout
        if (backend or "vane") == "vane":  # the device shares these cores: one thread pool
            host_blas.share()
        self.sig: Signature = signature(adapter)
        # The base is baked ("delta" programs, never patched) when the compile budget
        # holds 2 programs a block; otherwise it is a program input staged once
        # ("inputs", 2 programs a kind of block) and never rewritten either.
        self.strategy = strategy or self._strategy(backend)
        self.programs = TrainPrograms(arch, weights, seq, self.strategy, backend,
                                      lora=LoraSpec(self.sig, dropout > 0))
        self.compiles = self.programs.compiles
        self.run = BlockRunner(self.programs)
        self.host_ms = 0.0     # A/B gradients on the host, cumulative
        self.head_ms = 0.0     # classifier, loss and its gradient, cumulative
        self._lora: dict[int, dict[str, np.ndarray]] = {}
        self.write_adapter(adapter)

    def _strategy(self, backend: str | None) -> str:
        from orion.runtime import compile_budget, compile_count

        if backend == "reference":
            return "delta"
        left = compile_budget() - compile_count()
        return "delta" if 2 * (self.arch.args.n_layers + 1) <= left else "inputs"

    def write_adapter(self, adapter: Adapter) -> None:
        """The adapter's A and B'^T = (s B)^T in fp16, zero-padded to the programs'
        ranks (B'A is unchanged), for the programs' LoRA inputs (copied into their
        surfaces by each run: a few KB a layer; the base is never touched)."""
        if signature(adapter) != self.sig:
            raise LoraError("the adapter's modules or ranks differ from the programs'")
        for layer in range(self.arch.args.n_layers):
            feeds: dict[str, np.ndarray] = {}
            for module, rank in self.sig:
                a_name, b_name, _ = lora_names(module)
                for name, which in ((a_name, "a"), (b_name, "b")):
                    m = packed_matrix(adapter, layer, module, which)
                    padded = np.zeros((rank, m.shape[1]), np.float16)
                    padded[: m.shape[0]] = m
                    feeds[name] = padded.reshape(1, 1, rank, m.shape[1])
            self._lora[layer] = feeds

    def make_masks(self, rng: np.random.Generator) -> Masks:
        """One sequence's dropout masks, one per adapted (layer, module), [in, S]: 0 or
        1/(1-p) rounded to fp16 (the device multiplies by exactly these values)."""
        keep = np.float32(np.float16(1.0 / (1.0 - self.dropout)))
        out: Masks = {}
        for layer in range(self.arch.args.n_layers):
            for module, _ in self.sig:
                inp = self.arch.module_shape(module)[1]
                out[layer, module] = (rng.random((inp, self.seq)) >= self.dropout) * keep
        return out

    def _keep_all(self) -> Masks:
        return {(i, m): np.ones((self.arch.module_shape(m)[1], self.seq), np.float32)
                for i in range(self.arch.args.n_layers) for m, _ in self.sig}

    def _extra(self, masks: Masks | None) -> dict[int, dict[str, np.ndarray]]:
        """Each layer's LoRA inputs (and dropout masks)."""
        out = {}
        for layer, feeds in self._lora.items():
            feeds = dict(feeds)
            if masks is not None:
                for module, _ in self.sig:
                    feeds[lora_names(module)[2]] = masks[layer, module][None, :, None, :]
            out[layer] = feeds
        return out

    def __call__(self, adapter: Adapter, tokens: np.ndarray, targets: np.ndarray,
                 mask: np.ndarray, norm: int | None = None, loss_only: bool = False,
                 dropout: Sequence[Masks] | np.random.Generator | None = None
                 ) -> LoraStepOutput:
        """Loss and A/B gradients of a micro-batch [B, S] (mask: 1 where a target counts).
        Gradients are of sum(token losses) / norm (default: this batch's loss tokens),
        so micro-batches of one optimizer step add up to its mean. `loss_only` skips
        the backward (validation, with no dropout). With dropout, `dropout` is one
        `make_masks` per sequence, or a generator to draw them from."""
        arch = self.arch
        tokens, targets, mask = (np.atleast_2d(a) for a in (tokens, targets, mask))
        n_tok = int(mask.sum())
        norm = norm or max(n_tok, 1)
        grads = {k: np.zeros_like(v) for k, v in adapter.params().items()}
        counts = SanitizeCounts()
        cls = self.weights[arch.classifier_name]
        # a frozen compressed base (orion.models.frozen) reads its embedding rows itself
        source = self.weights if isinstance(self.weights, FrozenWeights) else \
            ArrayWeights(self.weights)
        total = 0.0
        inv = np.float32(1.0 / self.loss_scale)
        if self.dropout > 0 and isinstance(dropout, np.random.Generator):
            dropout = [self.make_masks(dropout) for _ in range(tokens.shape[0])]
        elif self.dropout > 0 and dropout is None and not loss_only:
            raise InvalidArgumentError("dropout > 0: give masks or a generator")
        for b in range(tokens.shape[0]):
            rows = np.flatnonzero(mask[b])
            if rows.size == 0:
                continue
            drop: Masks | None = None
            if self.dropout > 0:   # validation runs the programs with all-keep masks
                drop = dropout[b] if isinstance(dropout, Sequence) else self._keep_all()
            extra = self._extra(drop)
            inputs, xn = self.run.forward(to_device(arch.embed(source, tokens[b], 0)), extra,
                                          counts)
            t_head = time.perf_counter()
            logits = xn[rows] @ cls.T
            loss, dl = cross_entropy(logits, targets[b][rows],
                                     self.loss_scale * rows.size / norm, in_place=True)
            if not np.isfinite(loss):
                return LoraStepOutput(float("nan"), n_tok, grads, finite=False)
            total += loss * rows.size
            if loss_only:
                self.head_ms += (time.perf_counter() - t_head) * 1e3
                continue
            dxn = np.zeros_like(xn)
            dxn[rows] = dl @ cls
            dy = to_device(dxn)
            self.head_ms += (time.perf_counter() - t_head) * 1e3
            # every backward program before any A/B product: host BLAS threads spin
            # after a call and slow the device programs run between them
            taps = []
            for block in [FINAL, *reversed(range(arch.args.n_layers))]:
                x_in = inputs[-1] if block == FINAL else inputs[block]
                out = self.run("bwd", block, {"x": x_in, "grad_y": dy,
                                              **extra.get(block, {})}, counts)
                taps.append((block, {k: v for k, v in out.items() if k != "grad_x"}))
                dy = out["grad_x"]
            t_host = time.perf_counter()
            for block, outs in taps:
                for spec in self.programs.graphs[block].taps:
                    x = outs[spec.x].reshape(-1, self.seq)   # type: ignore[index]
                    d = outs[spec.dy].reshape(-1, self.seq) * inv
                    self._lora_grads(adapter, block, spec.param, x, d, grads)
            self.host_ms += (time.perf_counter() - t_host) * 1e3
        return LoraStepOutput(total / max(n_tok, 1), n_tok, grads, not counts.overflow)

    @staticmethod
    def _lora_grads(adapter: Adapter, layer: int, module: str, x: np.ndarray, dy: np.ndarray,
                    grads: dict[str, np.ndarray]) -> None:
        """dB += s dy (A x)^T, dA += s (B^T dy) x^T, for x [in, S], dy [out, S]."""
        a, b = adapter.matrices[layer, module]
        s = np.float32(adapter.scale(layer, module))
        grads[adapter.tensor(layer, module, "B")] += s * (dy @ (a @ x).T)
        grads[adapter.tensor(layer, module, "A")] += s * ((b.T @ dy) @ x.T)

    def release(self) -> None:
        self.programs.release()
