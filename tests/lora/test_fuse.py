"""`orion fuse`: a plain HF folder that transformers loads and that equals PEFT's
merge_and_unload()."""

from __future__ import annotations

import numpy as np
import pytest

from lora.conftest import peft_adapter
from orion.cli import main
from orion.lora.config import LoraError
from orion.lora.fuse import fuse


def test_fused_folder_equals_peft_merge_and_unload(llama_dir, tmp_path):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    ad = peft_adapter(llama_dir, tmp_path / "ad", seed=5, r=4, use_rslora=True,
                      rank_pattern={"o_proj": 2})
    assert main(["fuse", "--model", str(llama_dir), "--adapter-path", str(ad),
                 "--out", str(tmp_path / "fused")]) == 0
    fused = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "fused",
                                                          torch_dtype=torch.float32)
    base = transformers.LlamaForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(base, ad).merge_and_unload()
    a, b = fused.state_dict(), merged.state_dict()
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), atol=1e-6, rtol=1e-5,
                                   err_msg=k)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        np.testing.assert_allclose(fused(ids).logits.numpy(), merged(ids).logits.numpy(),
                                   atol=1e-4)
    assert (tmp_path / "fused/tokenizer.model").exists()


def test_fuse_keeps_the_base_dtype(tmp_path, llama_dir):
    from orion.lora.adapter import init_adapter, save_adapter
    from orion.lora.config import LoraConfig
    from orion.models.llama import default_model_path  # shipped in float16
    from orion.models.llama_weights import load_hf

    cfg, _ = load_hf(default_model_path())
    ad = init_adapter(LoraConfig(r=2, targets=("q_proj",)), cfg)
    save_adapter(tmp_path / "ad", ad)
    fuse(default_model_path(), tmp_path / "ad", tmp_path / "out")
    header = (tmp_path / "out/model.safetensors").read_bytes()[:4096]
    assert b'"F16"' in header and b'"F32"' not in header


def test_fuse_refuses_to_write_over_the_base(llama_dir, tmp_path):
    with pytest.raises(LoraError, match="must not be the base"):
        fuse(llama_dir, tmp_path, llama_dir)
