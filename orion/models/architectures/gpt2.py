"""GPT-2: learned position embeddings, LayerNorm, one fused q/k/v projection with
biases, a GELU (tanh form) MLP with biases, the classifier tied to the token embedding.

transformers' `GPT2LMHeadModel` names its tensors "transformer.h.0.attn.c_attn.weight"
and stores linear weights [in, out] (`Conv1D`); older checkpoints drop the
"transformer." prefix. Both load; the attention buffers some versions saved are not
parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.errors import ModelLoadError
from orion.ir.graph import Value
from orion.models.architecture import Architecture, AttentionSpec, TransformerArgs
from orion.models.blocks import Block, split_qkv
from orion.models.config_reader import MAX_HEADS, MAX_LAYERS, MAX_WIDTH, ConfigReader
from orion.models.weights import WeightSource
from orion.tokenizers.base import Tokenizer

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu")
BUFFERS = (".attn.bias", ".attn.masked_bias")   # saved by older transformers, not weights
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
PREFIX = "transformer."


@dataclass(frozen=True)
class Args(TransformerArgs):
    pass


class Model(Architecture):
    Args = Args
    title = "GPT-2"
    prefill_buckets = (32, 128, 512, 1024)
    decode_buckets = (256, 1024)
    embed_name = "transformer.wte.weight"
    residual_projections = ("attn.c_proj", "mlp.c_proj")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> Model:
        c = ConfigReader(config, where)
        for field, wanted in (("scale_attn_by_inverse_layer_idx", False),
                              ("add_cross_attention", False), ("scale_attn_weights", True),
                              ("reorder_and_upcast_attn", False)):
            if config.get(field, wanted) not in (wanted, None):
                raise c.fail(field, f"= {config[field]!r} is not supported")
        c.one_of("activation_function", GELU_TANH, "gelu_new")
        dim = c.int("n_embd", 1, MAX_WIDTH, 768, null_ok=False)
        heads = c.int("n_head", 1, MAX_HEADS, 12, null_ok=False)
        if dim % heads:
            raise c.fail("n_embd", f"{dim} is not a multiple of n_head {heads}")
        for field in ("bos_token_id", "eos_token_id"):
            c.optional_int(field, 0, 1 << 22)
        inner = c.optional_int("n_inner", 1, 1 << 18)
        return cls(Args(dim=dim, n_layers=c.int("n_layer", 1, MAX_LAYERS, 12, null_ok=False),
                        n_heads=heads, n_kv_heads=heads, head_dim=dim // heads,
                        vocab_size=c.int("vocab_size", 1, 1 << 22, 50257, null_ok=False),
                        hidden_dim=inner or 4 * dim,
                        max_positions=c.int("n_positions", 1, 1 << 20, 1024, null_ok=False),
                        norm_eps=c.float("layer_norm_epsilon", 0.0, 0.999999, 1e-5),
                        tie_embeddings=c.bool("tie_word_embeddings", True)))

    def to_config(self) -> dict[str, Any]:
        a = self.args
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "vocab_size": a.vocab_size, "n_positions": a.max_positions, "n_embd": a.dim,
                "n_layer": a.n_layers, "n_head": a.n_heads, "n_inner": a.hidden_dim,
                "layer_norm_epsilon": a.norm_eps, "activation_function": "gelu_new",
                "tie_word_embeddings": a.tie_embeddings}

    # ---- tensors ---------------------------------------------------------------------

    def layer_prefix(self, layer: int) -> str:
        return f"{PREFIX}h.{layer}."

    def global_parameters(self) -> dict[str, tuple[int, ...]]:
        a = self.args
        out = {self.embed_name: (a.vocab_size, a.dim),
               f"{PREFIX}wpe.weight": (a.max_positions, a.dim),
               f"{PREFIX}ln_f.weight": (a.dim,), f"{PREFIX}ln_f.bias": (a.dim,)}
        if not a.tie_embeddings:
            out[self.head_name] = (a.vocab_size, a.dim)
        return out

    def layer_parameters(self, layer: int) -> dict[str, tuple[int, ...]]:
        d, f = self.args.dim, self.args.hidden_dim
        return {"ln_1.weight": (d,), "ln_1.bias": (d,),
                "attn.c_attn.weight": (3 * d, d), "attn.c_attn.bias": (3 * d,),
                "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
                "ln_2.weight": (d,), "ln_2.bias": (d,),
                "mlp.c_fc.weight": (f, d), "mlp.c_fc.bias": (f,),
                "mlp.c_proj.weight": (d, f), "mlp.c_proj.bias": (d,)}

    def ignored_tensors(self, name: str) -> bool:
        return name.endswith(BUFFERS)

    def file_names(self, names: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in names:
            key = name if name.startswith((PREFIX, self.head_name)) else PREFIX + name
            if key in out:
                raise ModelLoadError(f"tensor {key} is stored twice, as {out[key]} and as "
                                     f"{name}")
            out[key] = name
        return out

    def stored_transposed(self, name: str) -> bool:
        return name.endswith(CONV1D)

    # ---- math ------------------------------------------------------------------------

    def default_tokenizer(self) -> Tokenizer:
        """GPT-2's own byte-level BPE (the ranks file Orion ships)."""
        from orion.tokenizers.gpt2 import GPT2Tokenizer

        return GPT2Tokenizer.default()

    def attention(self, layer: int) -> AttentionSpec:
        return AttentionSpec(None, 0, 1.0 / float(np.sqrt(self.args.head_dim)))

    def embed(self, w: WeightSource, ids: np.ndarray, start: int) -> np.ndarray:
        """Token plus position embeddings from `start`; only the rows asked for are read."""
        return (w.rows_fp32(self.embed_name, ids)
                + w.rows_fp32(f"{PREFIX}wpe.weight", slice(start, start + ids.size)))

    def embed_at(self, w: WeightSource, ids: np.ndarray, positions: np.ndarray
                 ) -> np.ndarray:
        return w.rows_fp32(self.embed_name, ids) + w.rows_fp32(f"{PREFIX}wpe.weight",
                                                               positions)

    def embed_backward(self, grads: dict[str, np.ndarray], ids: np.ndarray, start: int,
                       dx: np.ndarray) -> None:
        np.add.at(grads[self.embed_name], ids, dx)
        grads[f"{PREFIX}wpe.weight"][start: start + ids.size] += dx

    def layer(self, b: Block, x: Value) -> Value:
        h = b.layer_norm(x, "ln_1.weight", "ln_1.bias", name="ln1")
        q, k, v = split_qkv(b, b.linear(h, "attn.c_attn", bias=True))
        x2 = b.add(x, b.linear(b.attention(q, k, v), "attn.c_proj", bias=True), "x2")
        m = b.layer_norm(x2, "ln_2.weight", "ln_2.bias", name="ln2")
        m = b.gelu_tanh(b.linear(m, "mlp.c_fc", bias=True))
        return b.add(x2, b.linear(m, "mlp.c_proj", bias=True), "h")

    def final_norm(self, b: Block, x: Value) -> Value:
        return b.layer_norm(x, f"{PREFIX}ln_f.weight", f"{PREFIX}ln_f.bias", name="ln_f")
