"""Models on top of the compiler and runtime: one runtime for every causal LM
(`runtime`), the graph blocks architectures are written in (`blocks`), and one file
per architecture (`architectures/<model_type>.py`). `load_model` reads a folder."""

from orion.errors import ModelLoadError
from orion.models.base import CausalLM, ModelStats
from orion.models.registry import default_model_path, load_model
from orion.models.runtime import RuntimeOptions, TransformerLM

__all__ = ["CausalLM", "ModelLoadError", "ModelStats", "RuntimeOptions", "TransformerLM",
           "default_model_path", "load_model"]
