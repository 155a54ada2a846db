"""The Llama hyper-parameters (llama2.c's `ModelArgs`, nanoGPT's config dataclass).

One dataclass holds every number the architecture needs: RMSNorm, rotary embeddings
(rotate-half layout, as Hugging Face stores q/k), SwiGLU, grouped-query attention
(`n_kv_heads` < `n_heads`), tied or untied classifier.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class LlamaConfig:
    dim: int = 288                 # model width (channels of every activation)
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 6            # < n_heads: grouped-query attention
    vocab_size: int = 32000
    hidden_dim: int = 768          # SwiGLU width (w1/w3 rows, w2 columns)
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True    # classifier shares the token embedding matrix

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads "
                             f"{self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        for f in ("dim", "n_layers", "vocab_size", "hidden_dim", "max_seq_len"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, is {getattr(self, f)}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown Llama config keys: {sorted(unknown)}")
        return cls(**d)

    def n_params(self) -> int:
        d, h, kv = self.dim, self.hidden_dim, self.kv_dim
        per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * d * h
        emb = self.vocab_size * d
        return emb * (1 if self.tie_embeddings else 2) + self.n_layers * per_layer + d


# The llama2.c TinyStories configurations (Karpathy's model table) and ours.
PRESETS: dict[str, LlamaConfig] = {
    "stories15M": LlamaConfig(288, 6, 6, 6, 32000, 768, 256),
    "stories42M": LlamaConfig(512, 8, 8, 8, 32000, 1376, 1024),
    "stories110M": LlamaConfig(768, 12, 12, 12, 32000, 2048, 1024),
}
