"""Fixtures of the quantized-weight tests: small models on published configs (shrunk,
the vocabulary too), saved as Hugging Face folders, then quantized by the reference
tools themselves (mlx_lm.convert) or written as GGUF (tests/quant/gguf_writer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from models.hf_fixtures import save_numpy_init, shrunk

SMALL_VOCAB = {"vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2}


def small(name: str, **extra) -> dict:
    cfg = {**shrunk(name), **SMALL_VOCAB, **extra}
    cfg.pop("rope_scaling", None) if name.startswith("Llama") else None
    return cfg


@pytest.fixture(scope="session")
def qwen3_hf(tmp_path_factory) -> Path:
    return save_numpy_init(tmp_path_factory.mktemp("qwen3") / "hf", small("Qwen3-0.6B"))


@pytest.fixture(scope="session")
def llama_hf(tmp_path_factory) -> Path:
    """Llama 3.2's shape without its rope scaling (which GGUF stores as frequency
    factors, refused): widths that are whole K-quant blocks of 256."""
    return save_numpy_init(tmp_path_factory.mktemp("llama") / "hf", small("Llama-3.2-1B"))


def mlx_convert(hf: Path, out: Path, bits: int = 4, group: int = 64) -> Path:
    """`mlx_lm.convert -q`: the folder MLX users download, written by mlx-lm itself."""
    pytest.importorskip("mlx.core")
    convert = pytest.importorskip("mlx_lm").convert
    convert(str(hf), mlx_path=str(out), quantize=True, q_bits=bits, q_group_size=group)
    # mlx-lm gives a folder without a tokenizer a one-token stand-in, which the
    # generation config's end token (from transformers' save) lies past
    (out / "generation_config.json").unlink(missing_ok=True)
    return out


@pytest.fixture(scope="session")
def qwen3_mlx4(qwen3_hf, tmp_path_factory) -> Path:
    return mlx_convert(qwen3_hf, tmp_path_factory.mktemp("qwen3") / "mlx4")
