"""Fixtures of the model tests: Hugging Face GPT-2 model folders saved at test time
(transformers and torch are test-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

# ---- Hugging Face GPT-2 folders ------------------------------------------------

TINY = {"n_layer": 2, "n_embd": 256, "n_head": 4, "n_positions": 256, "vocab_size": 50257}
SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
EMBED_SCALE = 10.0
PROJ_SCALE = 2.0
HEAD_GAIN = 0.25


def successor_permutation(vocab: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).permutation(vocab)


def save_peaked_gpt2(folder: Path, config: dict, seed: int = 0) -> Path:
    """A GPT-2 of `config`, saved as transformers does (config.json + model.safetensors).

    Not pure noise, so that a greedy argmax means something: transformers' own random
    init (seeded); token embeddings scaled by EMBED_SCALE, so the residual stream keeps
    the current token's direction through the layers; the residual projections
    (attn.c_proj, mlp.c_proj) scaled by PROJ_SCALE, so that attention and the MLP
    still move every logit; and an untied LM head whose row for token succ[t] is the
    unit direction of t's embedding, times HEAD_GAIN. The logit of succ[t] then leads
    the runner-up by a few units (test_hf_reference.py checks the margin), while all
    50257 logits depend on every layer. succ is a fixed random permutation, so greedy
    text is not one repeated token.
    """
    torch = pytest.importorskip("torch", reason="torch (test-only) builds the HF fixture")
    transformers = pytest.importorskip("transformers", reason="transformers is test-only")
    import numpy as np

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(**config, tie_word_embeddings=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.transformer.wte.weight.mul_(EMBED_SCALE)
        for block in model.transformer.h:
            block.attn.c_proj.weight.mul_(PROJ_SCALE)
            block.mlp.c_proj.weight.mul_(PROJ_SCALE)
        wte = model.transformer.wte.weight.numpy()
        direction = wte / np.linalg.norm(wte, axis=1, keepdims=True)
        head = np.zeros_like(direction)
        head[successor_permutation(cfg.vocab_size, seed)] = HEAD_GAIN * direction
        model.lm_head.weight.copy_(torch.from_numpy(head))
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    """A 2-layer, 64-wide GPT-2 with GPT-2's vocabulary (fast)."""
    return save_peaked_gpt2(tmp_path_factory.mktemp("gpt2_tiny"), TINY)


@pytest.fixture(scope="session")
def small_gpt2_dir(tmp_path_factory) -> Path:
    """GPT-2 small (124M parameters; about 10 s to build and save)."""
    return save_peaked_gpt2(tmp_path_factory.mktemp("gpt2_small"), SMALL)


@pytest.fixture(scope="module")
def gpt2_compile_budget():
    """GPT-2 test modules load several models in one process; the budget models one
    generation's process (ANE-C31), so these modules raise it while they run."""
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)
    yield
    set_compile_budget(old)


@pytest.fixture(scope="session")
def tiny_gpt2(tiny_gpt2_dir):
    """The tiny GPT-2 on the backend, small buckets so that tests cross them."""
    from orion.models import load_model

    model = load_model(tiny_gpt2_dir, prefill_buckets=(32, 64), decode_buckets=(32, 64, 128))
    yield model
    model.close()


def random_adapter(arch, targets: tuple[str, ...], rank: int, seed: int):
    """A LoRA adapter of `rank` on `targets` with random A and B (PEFT's init has
    B = 0, which changes nothing), scaled to move the logits visibly."""
    import numpy as np

    from orion.formats.peft import LoraConfig
    from orion.models.adapters import init_adapter

    ad = init_adapter(LoraConfig(r=rank, alpha=2 * rank, targets=targets), arch, seed=seed)
    rng = np.random.default_rng(seed)
    for _a, b in ad.matrices.values():
        b[...] = rng.standard_normal(b.shape) * 0.2
    return ad


def load_shape(name: str, tiny_gpt2_dir: Path, tmp_path_factory):
    """"gpt2" (the tiny GPT-2) or a published config's shape (hf_fixtures.shrunk),
    loaded with small buckets so that tests cross them; the caller closes it."""
    from orion.models import load_model

    from .hf_fixtures import save_numpy_init, shrunk

    folder = tiny_gpt2_dir if name == "gpt2" else save_numpy_init(
        tmp_path_factory.mktemp(name), shrunk(name))
    return load_model(folder, prefill_buckets=(32, 64), decode_buckets=(32, 64, 128))


# the shapes the batch tests run: GPT-2, Qwen3 (GQA, q/k norms, RoPE) and, with
# `pytest -m slow` (which CI runs too: it keeps the README's quick run under 5 minutes),
# Gemma 3 (two masks: sliding windows)
SHAPES = ["gpt2", "Qwen3-0.6B", pytest.param("gemma-3-1b", marks=pytest.mark.slow)]


def qwen3_shape_slow(fixture: str = "shape_model") -> pytest.MarkDecorator:
    """For a test of several seconds a shape: its Qwen3 shape runs with `pytest -m
    slow`, and the quick run keeps GPT-2's (`fixture`: the shape fixture it reads)."""
    shapes = ["gpt2", pytest.param("Qwen3-0.6B", marks=pytest.mark.slow)]
    if fixture == "shape_model":
        shapes += SHAPES[2:]   # Gemma 3, slow already
    return pytest.mark.parametrize(fixture, shapes, indirect=True)


@pytest.fixture(scope="module", params=SHAPES)
def shape_model(request, tiny_gpt2_dir, tmp_path_factory):
    """Each of those shapes loaded by `load_shape`, for a module's tests."""
    m = load_shape(request.param, tiny_gpt2_dir, tmp_path_factory)
    yield m
    m.close()
