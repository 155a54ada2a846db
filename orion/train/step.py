"""One micro-batch forward and backward, split as the Orion paper does it:

    embedding (host) -> per block: the forward program (each block's input kept)
    -> classifier and cross-entropy (host, BLAS) on the final norm's output
    -> per block, in reverse: the backward program (input and taps)
    -> weight gradients from the taps on the host (dW = dY X^T, BLAS), embedding
       scatter-add

Device results are sanitized (`orion.train.stability`) before the host uses them. The
loss gradient is multiplied by the loss scale so fp16 backward values do not flush to
zero; the returned gradients are divided by it again, by scaling the smaller operand of
each weight-gradient product (an activation) rather than the gradient itself.

`Forward` and `BlockBackward` are the pieces both full training (`DeviceStep`) and LoRA
training (`orion.lora.step`) are made of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from orion.models.architecture import Architecture
from orion.models.weights import ArrayWeights
from orion.runtime import host_blas
from orion.train.loss import cross_entropy
from orion.train.programs import FINAL, param_gradient
from orion.train.stability import SanitizeCounts, sanitize
from orion.train.update import TrainPrograms

Weights = dict[str, np.ndarray]


@dataclass
class StepOutput:
    loss: float
    grads: Weights
    counts: SanitizeCounts = field(default_factory=SanitizeCounts)
    finite: bool = True


def to_device(a: np.ndarray) -> np.ndarray:
    """Token-major [S, C] -> device [1, C, 1, S]."""
    return np.ascontiguousarray(a.T, np.float32)[None, :, None, :]


def to_rows(a: np.ndarray) -> np.ndarray:
    """Device [1, C, 1, S] -> token-major [S, C]."""
    return a.reshape(a.shape[1], a.shape[3]).T


class BlockRunner:
    """Runs the programs of one model's blocks with their outputs sanitized, and keeps
    each program's output arrays from call to call (fresh arrays for Stories110M's
    activations cost ~170K page faults a step)."""

    def __init__(self, programs: TrainPrograms) -> None:
        self.programs = programs
        self._outputs: dict[tuple[str, int], dict[str, np.ndarray]] = {}

    def __call__(self, which: str, block: int, feeds: Mapping[str, np.ndarray],
                 counts: SanitizeCounts) -> dict[str, np.ndarray]:
        out = self.programs.run(which, block, feeds, self._outputs.get((which, block)))
        out = {k: sanitize(v, counts) for k, v in out.items()}
        self._outputs[which, block] = out
        return out

    def forward(self, x: np.ndarray, extra: Mapping[int, Mapping[str, np.ndarray]],
                counts: SanitizeCounts) -> tuple[list[np.ndarray], np.ndarray]:
        """Every layer's input (device layout) and the final norm's output [S, D]."""
        inputs = []
        for i in range(self.programs.arch.args.n_layers):
            inputs.append(x)
            x = self("fwd", i, {"x": x, **extra.get(i, {})}, counts)["y"]
        inputs.append(x)
        xn = to_rows(self("fwd", FINAL, {"x": x}, counts)["y"])
        return inputs, xn


class DeviceStep:
    """Forward + backward of one micro-batch on the block programs (full training)."""

    def __init__(self, arch: Architecture, programs: TrainPrograms) -> None:
        self.arch, self.programs = arch, programs
        if programs.backend == "vane":   # the device shares these cores: one thread pool
            host_blas.share()
        self.run = BlockRunner(programs)
        self._grads: Weights = {}
        self._logits: np.ndarray | None = None

    def __call__(self, weights: Weights, tokens: np.ndarray, targets: np.ndarray,
                 loss_scale: float = 1.0, accumulate: bool = False) -> StepOutput:
        """Loss and gradients of one micro-batch. The gradients live in buffers this
        step owns and overwrites on its next call; with `accumulate` that call adds its
        gradients to them instead (gradient accumulation over micro-batches)."""
        arch = self.arch
        tokens, targets = np.atleast_2d(tokens), np.atleast_2d(targets)
        batch = tokens.shape[0]
        for k, v in weights.items():
            buf = self._grads.get(k)
            if buf is None or buf.shape != v.shape:
                self._grads[k] = np.zeros_like(v)
            elif not accumulate:
                buf.fill(0)
        grads = self._grads
        inv = np.float32(1.0 / loss_scale)
        counts = SanitizeCounts()
        losses = []
        cls = weights[arch.classifier_name]
        source = ArrayWeights(weights)
        for b in range(batch):
            x = to_device(arch.embed(source, tokens[b], 0))
            inputs, xn = self.run.forward(x, {}, counts)
            logits = self._logits_buffer(xn.shape[0], cls.shape[0])
            np.matmul(xn, cls.T, out=logits)
            loss, dlogits = cross_entropy(logits, targets[b], loss_scale / batch, in_place=True)
            losses.append(loss)
            if not np.isfinite(loss):
                return StepOutput(float("nan"), grads, counts, finite=False)
            dy = to_device(dlogits @ cls)
            # every backward program before any weight-gradient product: the host BLAS
            # threads spin for a while after each call, and device programs run between
            # them measured 2x slower (Stories110M backward GEMMs)
            taps = []
            for block in [FINAL, *reversed(range(arch.args.n_layers))]:
                x_in = inputs[-1] if block == FINAL else inputs[block]
                out = self.run("bwd", block, {"x": x_in, "grad_y": dy}, counts)
                taps.append((block, {k: v for k, v in out.items() if k != "grad_x"}))
                dy = out["grad_x"]
            grads[arch.classifier_name] += dlogits.T @ (xn * inv)
            for block, outs in taps:
                for spec in self.programs.graphs[block].taps:
                    grads[spec.param] += param_gradient(spec, outs) * inv
            arch.embed_backward(grads, tokens[b], 0, to_rows(dy) * inv)
        return StepOutput(float(np.mean(losses)), grads, counts)

    def loss(self, weights: Weights, tokens: np.ndarray, targets: np.ndarray) -> float:
        """The mean cross-entropy of a batch, forward programs only (validation)."""
        arch = self.arch
        tokens, targets = np.atleast_2d(tokens), np.atleast_2d(targets)
        counts = SanitizeCounts()
        cls = weights[arch.classifier_name]
        source = ArrayWeights(weights)
        losses = []
        for b in range(tokens.shape[0]):
            _, xn = self.run.forward(to_device(arch.embed(source, tokens[b], 0)), {}, counts)
            logits = self._logits_buffer(xn.shape[0], cls.shape[0])
            np.matmul(xn, cls.T, out=logits)
            losses.append(cross_entropy(logits, targets[b], 1.0, in_place=True)[0])
        return float(np.mean(losses))

    def _logits_buffer(self, seq: int, vocab: int) -> np.ndarray:
        """[S, V] kept across calls: the logits, then their gradient in place."""
        buf = self._logits
        if buf is None or buf.shape != (seq, vocab):
            buf = self._logits = np.empty((seq, vocab), np.float32)
        return buf
