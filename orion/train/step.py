"""One micro-batch forward and backward, split as the Orion paper does it:

    embedding (host) -> per layer: attn_fwd, ffn_fwd programs (activations kept)
    -> final norm, classifier, cross-entropy (host, BLAS)
    -> per layer, in reverse: ffn_bwd, attn_bwd programs (activation gradients)
    -> weight gradients dW = dY X^T on the host (BLAS), embedding scatter-add

Device results are sanitized (`orion.train.stability`) before the host uses them. The
loss gradient is multiplied by the loss scale so fp16 backward values do not flush to
zero; the returned gradients are divided by it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

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

    def _run(self, kind: str, layer: int, feeds: dict[str, np.ndarray],
             counts: SanitizeCounts) -> dict[str, np.ndarray]:
        out = self.programs.run(kind, layer, feeds)
        return {k: sanitize(v, counts) for k, v in out.items()}

    def __call__(self, weights: Weights, tokens: np.ndarray, targets: np.ndarray,
                 loss_scale: float = 1.0) -> StepOutput:
        cfg = self.cfg
        tokens, targets = np.atleast_2d(tokens), np.atleast_2d(targets)
        batch = tokens.shape[0]
        # Each gradient is the first matmul result itself, summed into only when a
        # parameter gets several (batch items, tied embeddings): 440 MB of zeros per
        # step for Stories110M, and a pass over them per gradient, cost more.
        grads: Weights = {}
        self._dtypes = {k: v.dtype for k, v in weights.items()}
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
            logits = xfn @ cls.T
            loss, dlogits = ref.cross_entropy(logits, targets[b], loss_scale / batch)
            losses.append(loss)
            if not np.isfinite(loss):
                self._complete(grads, weights)
                return StepOutput(float("nan"), grads, counts, finite=False)
            dcls = dlogits.T @ xfn
            self._acc(grads, EMBED if cfg.tie_embeddings else LM_HEAD, dcls)
            dxf, dgf = ref.rms_norm_backward(dlogits @ cls, xf, weights[FINAL_NORM], inv_f)
            self._acc(grads, FINAL_NORM, dgf)
            dy = _dev(dxf)
            for i in reversed(range(cfg.n_layers)):
                t = taps[i]
                fb = self._run("ffn_bwd", i, {"dy": dy, "h": t["h"], "gate": t["gate"],
                                              "up": t["up"]}, counts)
                self._ffn_grads(grads, i, t, dy, fb)
                ab = self._run("attn_bwd", i, {"dh": fb["dh"], "x": t["x"], "q": t["q"],
                                               "k": t["k"], "v": t["v"]}, counts)
                self._attn_grads(grads, i, t, fb["dh"], ab)
                dy = ab["dx"]
            if EMBED not in grads:
                grads[EMBED] = np.zeros_like(weights[EMBED])
            np.add.at(grads[EMBED], tokens[b], _mat(dy).T)
        self._complete(grads, weights)
        inv_scale = 1.0 / loss_scale
        for g in grads.values():
            g *= inv_scale
        return StepOutput(float(np.mean(losses)), grads, counts)

    def _acc(self, grads: Weights, key: str, value: np.ndarray) -> None:
        value = np.asarray(value, dtype=self._dtypes[key])
        if key in grads:
            grads[key] += value
        else:
            grads[key] = value if value.flags.writeable and value.base is None else value.copy()

    @staticmethod
    def _complete(grads: Weights, weights: Weights) -> None:
        """Zeros for parameters that got no gradient, so callers see every key."""
        for k, v in weights.items():
            if k not in grads:
                grads[k] = np.zeros_like(v)

    def _ffn_grads(self, grads: Weights, i: int, t: dict[str, np.ndarray], dy: np.ndarray,
                   fb: dict[str, np.ndarray]) -> None:
        key = lambda s: layer_key(i, s)  # noqa: E731
        dy_m, hn = _mat(dy), _mat(t["hn"])
        self._acc(grads, key("mlp.down_proj.weight"), dy_m @ _mat(t["m"]).T)
        self._acc(grads, key("mlp.gate_proj.weight"), _mat(fb["dgate"]) @ hn.T)
        self._acc(grads, key("mlp.up_proj.weight"), _mat(fb["dup"]) @ hn.T)
        h = _mat(t["h"])
        self._acc(grads, key("post_attention_layernorm.weight"), np.sum(
            _mat(fb["dhn"]) * h * _inv_rms(h, self.cfg.norm_eps), axis=1))

    def _attn_grads(self, grads: Weights, i: int, t: dict[str, np.ndarray], dh: np.ndarray,
                    ab: dict[str, np.ndarray]) -> None:
        cfg = self.cfg
        key = lambda s: layer_key(i, s)  # noqa: E731
        xn = _mat(t["xn"])
        self._acc(grads, key("self_attn.o_proj.weight"), _mat(dh) @ _mat(t["att"]).T)
        self._acc(grads, key("self_attn.q_proj.weight"), _mat(ab["dq"]) @ xn.T)
        self._acc(grads, key("self_attn.k_proj.weight"), reduce_kv(_mat(ab["dk"]) @ xn.T, cfg))
        self._acc(grads, key("self_attn.v_proj.weight"), reduce_kv(_mat(ab["dv"]) @ xn.T, cfg))
        x = _mat(t["x"])
        self._acc(grads, key("input_layernorm.weight"), np.sum(
            _mat(ab["dxn"]) * x * _inv_rms(x, cfg.norm_eps), axis=1))
