"""AdamW on fp32 master weights (decoupled weight decay, Loshchilov & Hutter), and
global-norm gradient clipping. Norm gains and other 1-D parameters are not decayed
(nanoGPT's grouping).

The update itself is one fused pass in the C core (`orion_adamw_f32`): as numpy
expressions it is ten passes over the model per step. Clipping and gradient
accumulation fold into that pass as `grad_scale`, so the gradients are not rewritten
before it."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orion.errors import InvalidArgumentError
from orion.runtime._native import check, ffi, lib


def _ptr(a: np.ndarray) -> object:
    return ffi.cast("float *", ffi.from_buffer(a))


def grad_norm(grads: Mapping[str, np.ndarray]) -> float:
    """The global L2 norm of all gradients, summed in fp64 in a fixed order on the
    kernel threads (`np.dot` would run on BLAS threads, which then spin beside the
    AdamW pass that follows)."""
    total, out = 0.0, ffi.new("double *")
    for g in grads.values():
        a = np.ascontiguousarray(g, dtype=np.float32)
        check(lib.orion_sum_squares_f32(_ptr(a), a.size, out))
        total += out[0]
    return float(np.sqrt(total))


def clip_coef(norm: float, max_norm: float) -> float:
    """The factor that brings a gradient of global norm `norm` to at most max_norm
    (1 when it already is, or when max_norm <= 0: no clipping)."""
    if max_norm > 0 and norm > max_norm:
        return max_norm / (norm + 1e-6)
    return 1.0


def clip_grad_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scales all gradients in place so their global L2 norm is at most max_norm;
    returns the norm before clipping (max_norm <= 0 only measures)."""
    total = grad_norm(grads)
    coef = clip_coef(total, max_norm)
    if coef != 1.0:
        for g in grads.values():
            g *= np.float32(coef)
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
             lr: float | None = None, grad_scale: float = 1.0,
             half: Mapping[str, np.ndarray] | None = None) -> None:
        """Updates `params` (C-contiguous fp32 arrays) in place with the gradients
        `grads * grad_scale`. Each array of `half` (C-contiguous float16, keyed like
        `params`) gets its updated parameter rounded to fp16 in the same pass."""
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.t += 1
        bias1, bias2 = 1.0 - b1 ** self.t, 1.0 - b2 ** self.t
        for k, p in params.items():
            g = np.ascontiguousarray(grads[k], dtype=np.float32)
            m, v = self.m[k], self.v[k]
            if p.shape != g.shape or not p.flags.c_contiguous or p.dtype != np.float32:
                raise InvalidArgumentError(f"AdamW: {k}: parameter {p.dtype}{p.shape} "
                                           f"(C-contiguous float32 expected), gradient {g.shape}")
            h = None if half is None else half.get(k)
            if h is not None and (h.shape != p.shape or h.dtype != np.float16
                                  or not h.flags.c_contiguous or not h.flags.writeable):
                raise InvalidArgumentError(f"AdamW: {k}: fp16 copy {h.dtype}{h.shape} (a writable "
                                           f"C-contiguous float16 array of shape {p.shape} "
                                           f"expected)")
            if h is not None and any(np.may_share_memory(h, a) for a in (p, g, m, v)):
                raise InvalidArgumentError(f"AdamW: {k}: the fp16 copy overlaps the parameter or "
                                           f"its state")
            decay = 1.0 - lr * self.weight_decay if p.ndim >= 2 else 1.0
            check(lib.orion_adamw_f32(_ptr(p), _ptr(g), _ptr(m), _ptr(v), p.size,
                                      grad_scale, b1, b2, self.eps, decay, lr / bias1, bias2,
                                      ffi.NULL if h is None
                                      else ffi.cast("uint16_t *", ffi.from_buffer(h))))

    def state_tensors(self) -> dict[str, np.ndarray]:
        out = {f"optim.m.{k}": v for k, v in self.m.items()}
        out.update({f"optim.v.{k}": v for k, v in self.v.items()})
        return out

    def load_state_tensors(self, tensors: Mapping[str, np.ndarray], t: int) -> None:
        for k in self.m:
            self.m[k] = np.array(tensors[f"optim.m.{k}"], np.float32)
            self.v[k] = np.array(tensors[f"optim.v.{k}"], np.float32)
        self.t = t
