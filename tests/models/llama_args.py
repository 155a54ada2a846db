"""Small Llama models for tests, from Orion's Llama fields (as a training config gives
them: dim, n_layers, n_heads, n_kv_heads, vocab_size, hidden_dim, max_seq_len, ...)."""

from __future__ import annotations

from typing import Any

from orion.models.architectures.llama import Model
from orion.train.config import architecture_of


def llama(**fields: Any) -> Model:
    arch = architecture_of(fields, "test model")
    assert isinstance(arch, Model)
    return arch
