"""AdamW on fp32 master weights (decoupled weight decay, Loshchilov & Hutter), and
global-norm gradient clipping. Norm gains and other 1-D parameters are not decayed
(nanoGPT's grouping)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def clip_grad_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scales all gradients in place so their global L2 norm is at most max_norm;
    returns the norm before clipping (max_norm <= 0 only measures)."""
    total = float(np.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in grads.values())))
    if max_norm > 0 and total > max_norm:
        scale = np.float32(max_norm / (total + 1e-6))
        for g in grads.values():
            g *= scale
    return total


class AdamW:
    def __init__(self, params: Mapping[str, np.ndarray], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.1) -> None:
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.m = {k: np.zeros_like(v, np.float32) for k, v in params.items()}
        self.v = {k: np.zeros_like(v, np.float32) for k, v in params.items()}
        self.t = 0

    def step(self, params: dict[str, np.ndarray], grads: Mapping[str, np.ndarray],
             lr: float | None = None) -> None:
        """Updates `params` (fp32 arrays) in place."""
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.t += 1
        c1 = 1.0 - b1 ** self.t
        c2 = 1.0 - b2 ** self.t
        for k, p in params.items():
            g = grads[k]
            m, v = self.m[k], self.v[k]
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            v += (1.0 - b2) * (g * g)
            if self.weight_decay and p.ndim >= 2:
                p *= np.float32(1.0 - lr * self.weight_decay)
            p -= np.float32(lr / c1) * m / (np.sqrt(v / np.float32(c2)) + np.float32(self.eps))

    def state_tensors(self) -> dict[str, np.ndarray]:
        out = {f"optim.m.{k}": v for k, v in self.m.items()}
        out.update({f"optim.v.{k}": v for k, v in self.v.items()})
        return out

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray], t: int) -> None:
        for k in self.m:
            self.m[k] = np.array(tensors[f"optim.m.{k}"], np.float32)
            self.v[k] = np.array(tensors[f"optim.v.{k}"], np.float32)
        self.t = t
