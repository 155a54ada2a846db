"""The Llama-family hyper-parameters (llama2.c's `ModelArgs`, nanoGPT's config dataclass).

One dataclass holds every number the architecture needs: RMSNorm, rotary embeddings
(rotate-half layout, as Hugging Face stores q/k), SwiGLU, grouped-query attention
(`n_kv_heads` < `n_heads`), tied or untied classifier. The options of the Hugging Face
families (`model_type` llama, mistral, qwen2, qwen3) are fields here too, off by
default: an explicit head size, q/k/v (and o) biases, per-head q/k RMSNorm, scaled RoPE
frequencies and a sliding attention window. docs/models.md says what each one means.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (Hugging Face `rope_scaling`): "linear" divides every
    frequency by `factor`; "llama3" (Llama 3.1/3.2) divides the low frequencies by
    `factor`, keeps the high ones and blends between (see `orion.models.llama_rope`)."""

    kind: str = "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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
    # ---- options of the Hugging Face families (off: the plain Llama above) ----
    head_size: int = 0             # 0: dim // n_heads; Qwen3 and Mistral-Nemo set it
    qkv_bias: bool = False         # Qwen2; Llama/Qwen3 with attention_bias
    o_bias: bool = False           # Llama/Qwen3 with attention_bias
    qk_norm: bool = False          # Qwen3: RMSNorm of each q and k head before RoPE
    rope_scaling: RopeScaling | None = None
    sliding_window: int = 0        # Mistral: 0 = full attention
    model_type: str = "llama"

    def __post_init__(self) -> None:
        for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim",
                  "max_seq_len"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, is {getattr(self, f)}")
        if not self.head_size and self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads "
                             f"{self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if isinstance(self.rope_scaling, dict):  # from_dict / asdict round trip
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def plain(self) -> bool:
        """No family option in use: what the training programs implement."""
        return (self.q_dim == self.dim and not (self.qkv_bias or self.o_bias or self.qk_norm)
                and self.rope_scaling is None and not self.sliding_window)

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
        d, h, kv, q = self.dim, self.hidden_dim, self.kv_dim, self.q_dim
        per_layer = 2 * d + 2 * q * d + 2 * kv * d + 3 * d * h
        per_layer += (q + 2 * kv) * self.qkv_bias + d * self.o_bias
        per_layer += 2 * self.head_dim * self.qk_norm
        emb = self.vocab_size * d
        return emb * (1 if self.tie_embeddings else 2) + self.n_layers * per_layer + d


# The llama2.c TinyStories configurations (Karpathy's model table) and ours.
PRESETS: dict[str, LlamaConfig] = {
    "stories15M": LlamaConfig(288, 6, 6, 6, 32000, 768, 256),
    "stories42M": LlamaConfig(512, 8, 8, 8, 32000, 1376, 1024),
    "stories110M": LlamaConfig(768, 12, 12, 12, 32000, 2048, 1024),
}
