"""What an architecture file defines, and what the one runtime asks of it.

An architecture is a file in `orion/models/architectures/`, named by the `model_type`
of the config.json it reads (mlx-lm's `models/<model_type>.py`). It defines

    Args          a frozen dataclass over `TransformerArgs`: every number the math
                  needs, parsed and checked from config.json (`from_config`)
    Model         an `Architecture` subclass: its tensors (`parameters`, Hugging Face
                  names and shapes), how each layer attends (`attention`), and the
                  layer itself as graph blocks (`layer`, `final_norm`), written once
                  for prefill, decode and training (`orion.models.blocks`)

and nothing else: buckets, surfaces, the KV cache, programs, LoRA inputs, decode
sequences and the training step are the runtime's (`orion.models.runtime`,
`orion.train`). docs/adding-a-model.md is the recipe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from orion.errors import ModelLoadError
from orion.models.rope import Rope

if TYPE_CHECKING:
    from orion.ir.graph import Value
    from orion.models.blocks import Block
    from orion.models.weights import WeightSource
    from orion.tokenizers.base import Tokenizer


@dataclass(frozen=True)
class TransformerArgs:
    """The numbers every decoder-only transformer has (what the runtime sizes from)."""

    dim: int                  # width of the residual stream
    n_layers: int
    n_heads: int
    n_kv_heads: int           # < n_heads: grouped-query attention
    head_dim: int
    vocab_size: int           # rows of the embedding
    hidden_dim: int           # the MLP's inner width
    max_positions: int        # the context the model was trained for
    norm_eps: float
    tie_embeddings: bool      # the classifier is the token embedding

    def __post_init__(self) -> None:
        for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size",
                  "hidden_dim", "max_positions"):
            if getattr(self, f) <= 0:
                raise ModelLoadError(f"{f} must be positive, is {getattr(self, f)}")
        if self.n_heads % self.n_kv_heads:
            raise ModelLoadError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads "
                                 f"{self.n_kv_heads}")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (nested dataclasses as objects)."""
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TransformerArgs:
        """The inverse of `to_dict` (checkpoints keep the args this way)."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ModelLoadError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
        return cls(**d)


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer attends: the rotation of its queries and keys (None: positions
    come from the embedding, as GPT-2's), the window (0: every earlier position; W: the
    W most recent, itself included) and the scale of the scores."""

    rope: Rope | None
    window: int
    scale: float


class Architecture:
    """The base of every `Model` (see the module docstring). Subclasses set `Args`,
    `title` and the methods marked as theirs; the rest has a default that a file
    overrides only where its model differs."""

    Args: ClassVar[type[TransformerArgs]]
    title: ClassVar[str]                 # "Llama", shown in the model's repr
    # prompt lengths and KV cache lengths the runtime compiles for (multiples of 32)
    prefill_buckets: ClassVar[tuple[int, ...]] = (32, 128, 512)
    decode_buckets: ClassVar[tuple[int, ...]] = (256, 1024, 2048)
    embed_name: ClassVar[str] = "model.embed_tokens.weight"
    head_name: ClassVar[str] = "lm_head.weight"
    # the linear layers that write into the residual stream (initialized smaller)
    residual_projections: ClassVar[tuple[str, ...]] = ("self_attn.o_proj", "mlp.down_proj")
    norm_init: ClassVar[float] = 1.0     # a fresh norm's gain (0 for a (1 + w) gain)

    def __init__(self, args: TransformerArgs) -> None:
        self.args = args

    @property
    def model_type(self) -> str:
        return type(self).__module__.rsplit(".", 1)[-1]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.args == self.args  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.args))

    # ---- the file's own -----------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> Architecture:
        """The model of a config.json, every field checked (`ConfigReader`)."""
        raise NotImplementedError

    def to_config(self) -> dict[str, Any]:
        """config.json for this model (what transformers and `orion.load` read)."""
        raise NotImplementedError

    def layer_parameters(self, layer: int) -> dict[str, tuple[int, ...]]:
        """The layer's tensors: suffix after `layer_prefix(layer)` -> shape ([out, in]
        for a linear layer)."""
        raise NotImplementedError

    def attention(self, layer: int) -> AttentionSpec:
        raise NotImplementedError

    def layer(self, b: Block, x: Value) -> Value:
        """One decoder layer: x [1, D, 1, S] -> the next residual stream."""
        raise NotImplementedError

    def final_norm(self, b: Block, x: Value) -> Value:
        raise NotImplementedError

    # ---- defaults ---------------------------------------------------------------------

    def layer_prefix(self, layer: int) -> str:
        return f"model.layers.{layer}."

    def global_parameters(self) -> dict[str, tuple[int, ...]]:
        """The tensors outside the layers: embedding, final norm, classifier."""
        a = self.args
        out = {self.embed_name: (a.vocab_size, a.dim), "model.norm.weight": (a.dim,)}
        if not a.tie_embeddings:
            out[self.head_name] = (a.vocab_size, a.dim)
        return out

    def parameters(self) -> dict[str, tuple[int, ...]]:
        """Every tensor by its Hugging Face name, in a fixed order: the embedding, the
        layers, then the rest."""
        glob = self.global_parameters()
        out = {self.embed_name: glob[self.embed_name]}
        for i in range(self.args.n_layers):
            prefix = self.layer_prefix(i)
            out.update({prefix + k: s for k, s in self.layer_parameters(i).items()})
        out.update(glob)
        return out

    def ignored_tensors(self, name: str) -> bool:
        """Tensors a checkpoint may hold that are not parameters (buffers)."""
        return name.endswith("rotary_emb.inv_freq")

    def file_names(self, names: Sequence[str]) -> dict[str, str]:
        """Parameter name -> the name a file stores it under (identity here; GPT-2's
        files may carry a "transformer." prefix)."""
        return {n: n for n in names}

    def stored_transposed(self, name: str) -> bool:
        """Whether a file stores this tensor [in, out] (GPT-2's Conv1D)."""
        return False

    @property
    def classifier_name(self) -> str:
        return self.embed_name if self.args.tie_embeddings else self.head_name

    def linear_modules(self) -> tuple[str, ...]:
        """Every linear layer of a layer, by its module path ("self_attn.q_proj"): what
        LoRA may adapt. Found from the parameters: a 2-D `<module>.weight`."""
        return tuple(k[: -len(".weight")] for k, s in self.layer_parameters(0).items()
                     if k.endswith(".weight") and len(s) == 2)

    def module_shape(self, module: str, layer: int = 0) -> tuple[int, int]:
        """(out, in) of a linear layer."""
        out, inp = self.layer_parameters(layer)[f"{module}.weight"]
        return out, inp

    def embed(self, w: WeightSource, ids: np.ndarray, start: int) -> np.ndarray:
        """fp32 [len(ids), D]: the residual stream's first value for these tokens at
        positions start, start + 1, ..."""
        return w.rows_fp32(self.embed_name, ids)

    def embed_at(self, w: WeightSource, ids: np.ndarray, positions: np.ndarray
                 ) -> np.ndarray:
        """`embed` of tokens each at its own position (a batch's rows, one a sequence),
        in one read. Only a learned position table reads the positions, and such an
        architecture overrides this (GPT-2); no other embedding depends on them."""
        return self.embed(w, ids, 0)

    def embed_backward(self, grads: dict[str, np.ndarray], ids: np.ndarray, start: int,
                       dx: np.ndarray) -> None:
        """Adds the gradient of `embed` for dx [len(ids), D] into `grads`."""
        np.add.at(grads[self.embed_name], ids, dx)

    def default_tokenizer(self) -> Tokenizer | None:
        """The tokenizer of a folder that ships none (None: it has no tokenizer)."""
        return None

    def describe(self) -> str:
        a = self.args
        return (f"{a.n_layers} layers, dim {a.dim}, {a.n_heads} heads, vocab "
                f"{a.vocab_size}")
