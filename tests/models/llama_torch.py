"""A transformers LlamaForCausalLM holding Orion's weights: the test-only reference."""

from __future__ import annotations

import numpy as np
import pytest

from orion.models.architectures.llama import Args as LlamaConfig
from orion.models.architectures.llama import Model


def hf_model(cfg: LlamaConfig, weights: dict[str, np.ndarray], dtype: str = "float64"):
    torch = pytest.importorskip("torch", reason="PyTorch is the test-only reference")
    transformers = pytest.importorskip("transformers", reason="HF Llama is the reference")
    hcfg = transformers.LlamaConfig(**{k: v for k, v in Model(cfg).to_config().items()
                                       if k not in ("architectures", "model_type",
                                                    "torch_dtype")})
    hcfg._attn_implementation = "eager"
    tdtype = getattr(torch, dtype)
    model = transformers.LlamaForCausalLM(hcfg).to(tdtype)
    state = {k: torch.from_numpy(np.asarray(v, np.float64)).to(tdtype)
             for k, v in weights.items()}
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    # HF computes the RoPE frequencies in fp32; exact ones keep fp64 comparisons tight
    hd = cfg.head_dim
    model.model.rotary_emb.inv_freq = 1.0 / cfg.rope_theta ** (
        torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    model.eval()
    return model
