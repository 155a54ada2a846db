"""Models on top of the compiler and runtime: configs, weight loading, tokenizers,
GPT-2 and Llama. `orion.models.base` holds the protocol they share."""

from orion.errors import ModelLoadError
from orion.models.base import CausalLM, ModelStats, load_model
from orion.tokenizers.base import Tokenizer

__all__ = ["CausalLM", "ModelLoadError", "ModelStats", "Tokenizer", "load_model"]
