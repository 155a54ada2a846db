"""One micro-batch forward and backward, split as the Orion paper does it:

    embedding (host) -> per layer: attn_fwd, ffn_fwd programs (activations kept)
    -> final norm, classifier, cross-entropy (host, BLAS)
    -> per layer, in reverse: ffn_bwd, attn_bwd programs (activation gradients)
    -> weight gradients dW = dY X^T on the host (BLAS), embedding scatter-add

Device results are sanitized (`orion.train.stability`) before the host uses them. The
loss gradient is multiplied by the loss scale so fp16 backward values do not flush to
zero; the returned gradients are divided by it again, by scaling the smaller operand of
each weight-gradient product (an activation) rather than the gradient itself: for
Stories110M that is 22 MB of activations a step instead of 440 MB of gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orion import host_blas
from orion.models import llama_reference as ref
from orion.models.llama_config import LlamaConfig
from orion.models.llama_programs import reduce_kv
from orion.models.llama_weights import EMBED, FINAL_NORM, LM_HEAD, Weights, layer_key
from orion.train.stability import SanitizeCounts, sanitize
from orion.train.update import LayerPrograms


@dataclass
class StepOutput:
    loss: float
    grads: Weights
    counts: SanitizeCounts = field(default_factory=SanitizeCounts)
    finite: bool = True


def _dev(a: np.ndarray) -> np.ndarray:
    """Token-major [S, C] -> device [1, C, 1, S]."""
    return np.ascontiguousarray(a.T, np.float32)[None, :, None, :]


def _mat(a: np.ndarray) -> np.ndarray:
    """Device [1, C, 1, S] -> [C, S]."""
    return a.reshape(a.shape[1], a.shape[3])


def _inv_rms(x: np.ndarray, eps: float) -> np.ndarray:
    """[C, S] -> [1, S]: (mean over channels of x^2 + eps)^-1/2."""
    return 1.0 / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps)


class DeviceStep:
    """Forward + backward of one micro-batch on the layer programs."""

    def __init__(self, cfg: LlamaConfig, programs: LayerPrograms) -> None:
        self.cfg, self.programs = cfg, programs
        if programs.backend == "vane":   # the device shares these cores: one thread pool
            host_blas.share()
        # Gradients and program outputs go to buffers kept from call to call: fresh
        # arrays for Stories110M's 440 MB of gradients and 170 MB of activations cost
        # 170K page faults a step (0.3-1 s of system time).
        self._grads: Weights = {}
        self._written: set[str] = set()
        self._outputs: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self._logits: np.ndarray | None = None

    def _run(self, kind: str, layer: int, feeds: dict[str, np.ndarray],
             counts: SanitizeCounts) -> dict[str, np.ndarray]:
        out = self.programs.run(kind, layer, feeds, self._outputs.get((kind, layer)))
        out = {k: sanitize(v, counts) for k, v in out.items()}
        self._outputs[kind, layer] = out    # this call's arrays serve the next
        return out

    def __call__(self, weights: Weights, tokens: np.ndarray, targets: np.ndarray,
                 loss_scale: float = 1.0, accumulate: bool = False) -> StepOutput:
        """Loss and gradients of one micro-batch. The gradients live in buffers this
        step owns and overwrites on its next call; with `accumulate` that call adds
        its gradients to them instead (gradient accumulation over micro-batches)."""
        cfg = self.cfg
        tokens, targets = np.atleast_2d(tokens), np.atleast_2d(targets)
        batch = tokens.shape[0]
        for k, v in weights.items():
            buf = self._grads.get(k)
            if buf is None or buf.shape != v.shape or buf.dtype != v.dtype:
                self._grads[k] = np.zeros_like(v)
        # Each gradient buffer is written by its first product (matmul out=) and
        # summed into only when a parameter gets several (batch items, tied
        # embeddings, accumulation): no zero fill and extra pass per step.
        self._written = set(self._grads) if accumulate else set()
        grads = self._grads
        self._inv_scale = 1.0 / loss_scale
        counts = SanitizeCounts()
        losses = []
        cls = weights[EMBED] if cfg.tie_embeddings else weights[LM_HEAD]
        for b in range(batch):
            taps: list[dict[str, Any]] = []
            x = _dev(weights[EMBED][tokens[b]])
            for i in range(cfg.n_layers):
                a = self._run("attn_fwd", i, {"x": x}, counts)
                f = self._run("ffn_fwd", i, {"h": a["h"]}, counts)
                taps.append({"x": x, **a, **{k: v for k, v in f.items() if k != "y"}})
                x = f["y"]
            # head on the host
            xf = _mat(x).T                                            # [S, D]
            xfn, inv_f = ref.rms_norm(xf, weights[FINAL_NORM], cfg.norm_eps)
            logits = self._logits_buffer(xfn.shape[0], cls.shape[0], xfn.dtype)
            np.matmul(xfn, cls.T, out=logits)
            loss, dlogits = ref.cross_entropy(logits, targets[b], loss_scale / batch,
                                              in_place=True)
            losses.append(loss)
            if not np.isfinite(loss):
                self._zero_unwritten()
                return StepOutput(float("nan"), grads, counts, finite=False)
            dxf, dgf = ref.rms_norm_backward(dlogits @ cls, xf, weights[FINAL_NORM], inv_f)
            self._add(FINAL_NORM, self._unscaled(dgf))
            dy = _dev(dxf)
            # Every backward program runs before any weight-gradient product: the host
            # BLAS threads spin for a while after each call, and device programs run
            # between them measured 2x slower (Stories110M backward GEMMs).
            backward = []
            for i in reversed(range(cfg.n_layers)):
                t = taps[i]
                fb = self._run("ffn_bwd", i, {"dy": dy, "h": t["h"], "gate": t["gate"],
                                              "up": t["up"]}, counts)
                ab = self._run("attn_bwd", i, {"dh": fb["dh"], "x": t["x"], "q": t["q"],
                                               "k": t["k"], "v": t["v"]}, counts)
                backward.append((i, dy, fb, ab))
                dy = ab["dx"]
            self._add_product(EMBED if cfg.tie_embeddings else LM_HEAD, dlogits.T,
                              self._unscaled(xfn))
            for i, dy_i, fb, ab in backward:
                self._ffn_grads(i, taps[i], dy_i, fb)
                self._attn_grads(i, taps[i], fb["dh"], ab)
            np.add.at(self._buffer(EMBED), tokens[b], self._unscaled(_mat(dy)).T)
        self._zero_unwritten()
        return StepOutput(float(np.mean(losses)), grads, counts)

    def loss(self, weights: Weights, tokens: np.ndarray, targets: np.ndarray) -> float:
        """The mean cross-entropy of a batch, forward programs only (validation)."""
        cfg = self.cfg
        tokens, targets = np.atleast_2d(tokens), np.atleast_2d(targets)
        counts = SanitizeCounts()
        cls = weights[EMBED] if cfg.tie_embeddings else weights[LM_HEAD]
        losses = []
        for b in range(tokens.shape[0]):
            x = _dev(weights[EMBED][tokens[b]])
            for i in range(cfg.n_layers):
                a = self._run("attn_fwd", i, {"x": x}, counts)
                x = self._run("ffn_fwd", i, {"h": a["h"]}, counts)["y"]
            xfn, _ = ref.rms_norm(_mat(x).T, weights[FINAL_NORM], cfg.norm_eps)
            logits = self._logits_buffer(xfn.shape[0], cls.shape[0], xfn.dtype)
            np.matmul(xfn, cls.T, out=logits)
            losses.append(ref.cross_entropy(logits, targets[b], 1.0, in_place=True)[0])
        return float(np.mean(losses))

    def _logits_buffer(self, seq: int, vocab: int, dtype: np.dtype) -> np.ndarray:
        """[S, V] kept across calls: the logits, then their gradient in place."""
        buf = self._logits
        if buf is None or buf.shape != (seq, vocab) or buf.dtype != dtype:
            buf = self._logits = np.empty((seq, vocab), dtype)
        return buf

    def _unscaled(self, a: np.ndarray) -> np.ndarray:
        """`a` divided by the loss scale (`a` itself when the scale is 1)."""
        return a if self._inv_scale == 1.0 else a * np.float32(self._inv_scale)

    def _buffer(self, key: str) -> np.ndarray:
        """The gradient buffer of `key`, ready to be summed into."""
        if key not in self._written:
            self._grads[key].fill(0)
            self._written.add(key)
        return self._grads[key]

    def _add(self, key: str, value: np.ndarray) -> None:
        if key in self._written:
            self._grads[key] += value
        else:
            self._grads[key][...] = value
            self._written.add(key)

    def _add_product(self, key: str, a: np.ndarray, b: np.ndarray) -> None:
        """grad[key] (+)= a @ b, written in place by the first product."""
        if key in self._written:
            self._grads[key] += a @ b
        else:
            np.matmul(a, b, out=self._grads[key])
            self._written.add(key)

    def _zero_unwritten(self) -> None:
        """Zeros for parameters that got no gradient, so callers see every key."""
        for k in self._grads.keys() - self._written:
            self._grads[k].fill(0)
        self._written = set(self._grads)

    def _ffn_grads(self, i: int, t: dict[str, np.ndarray], dy: np.ndarray,
                   fb: dict[str, np.ndarray]) -> None:
        key = lambda s: layer_key(i, s)  # noqa: E731
        dy_m, hn = self._unscaled(_mat(dy)), self._unscaled(_mat(t["hn"]))
        self._add_product(key("mlp.down_proj.weight"), dy_m, _mat(t["m"]).T)
        self._add_product(key("mlp.gate_proj.weight"), _mat(fb["dgate"]), hn.T)
        self._add_product(key("mlp.up_proj.weight"), _mat(fb["dup"]), hn.T)
        h = _mat(t["h"])
        self._add(key("post_attention_layernorm.weight"), self._unscaled(np.sum(
            _mat(fb["dhn"]) * h * _inv_rms(h, self.cfg.norm_eps), axis=1)))

    def _attn_grads(self, i: int, t: dict[str, np.ndarray], dh: np.ndarray,
                    ab: dict[str, np.ndarray]) -> None:
        cfg = self.cfg
        key = lambda s: layer_key(i, s)  # noqa: E731
        xn = self._unscaled(_mat(t["xn"]))
        self._add_product(key("self_attn.o_proj.weight"), self._unscaled(_mat(dh)),
                          _mat(t["att"]).T)
        self._add_product(key("self_attn.q_proj.weight"), _mat(ab["dq"]), xn.T)
        for name in ("k", "v"):
            param, d = key(f"self_attn.{name}_proj.weight"), _mat(ab[f"d{name}"])
            if cfg.n_kv_heads == cfg.n_heads:
                self._add_product(param, d, xn.T)
            else:   # grouped-query attention: summed back over each group
                self._add(param, reduce_kv(d @ xn.T, cfg))
        x = _mat(t["x"])
        self._add(key("input_layernorm.weight"), self._unscaled(np.sum(
            _mat(ab["dxn"]) * x * _inv_rms(x, cfg.norm_eps), axis=1)))
