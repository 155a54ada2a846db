"""Models on top of the compiler and runtime: configs, weight loading, tokenizers,
GPT-2 and Llama. `orion.models.base` holds the protocol they share."""

from orion.models.base import CausalLM, ModelLoadError, ModelStats, Tokenizer, load_model

__all__ = ["CausalLM", "ModelLoadError", "ModelStats", "Tokenizer", "load_model"]
