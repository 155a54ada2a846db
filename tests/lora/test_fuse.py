"""`orion fuse`: a plain HF folder that transformers loads and that equals PEFT's
merge_and_unload()."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lora.conftest import peft_adapter
from orion.cli import main
from orion.errors import LoraError
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
    from orion.formats.peft import LoraConfig
    from orion.models import default_model_path  # shipped in float16
    from orion.models.adapters import init_adapter, save_adapter
    from orion.models.registry import load_hf_arrays

    cfg, _ = load_hf_arrays(default_model_path())
    ad = init_adapter(LoraConfig(r=2, targets=("q_proj",)), cfg)
    save_adapter(tmp_path / "ad", ad)
    fuse(default_model_path(), tmp_path / "ad", tmp_path / "out")
    header = (tmp_path / "out/model.safetensors").read_bytes()[:4096]
    assert b'"F16"' in header and b'"F32"' not in header


def test_fuse_refuses_to_write_over_the_base(llama_dir, tmp_path):
    with pytest.raises(LoraError, match="must not be the base"):
        fuse(llama_dir, tmp_path, llama_dir)


def _bf16_ulps(a, b) -> np.ndarray:
    """How many bf16 steps apart two bf16 tensors are, element by element (the bit
    patterns of same-sign floats are ordered; opposite signs count through zero)."""
    def ordered(t):
        bits = t.view(dtype=__import__("torch").int16).numpy().astype(np.int32)
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    return np.abs(ordered(a) - ordered(b))


def test_bf16_base_fuses_to_bf16_equal_to_peft_merge_in_bf16(tmp_path):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from lora.conftest import hf_llama

    base_dir = tmp_path / "bf16"
    hf_llama(seed=3).to(torch.bfloat16).save_pretrained(base_dir, safe_serialization=True)
    ad = peft_adapter(base_dir, tmp_path / "ad", seed=7, r=4)
    assert main(["fuse", "--model", str(base_dir), "--adapter-path", str(ad),
                 "--out", str(tmp_path / "fused")]) == 0
    config = json.loads((tmp_path / "fused/config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    fused = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "fused", dtype="auto")
    base = transformers.LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
    merged = peft.PeftModel.from_pretrained(base, ad).merge_and_unload()
    a, b = fused.state_dict(), merged.state_dict()
    assert set(a) == set(b)
    changed = 0
    for k in a:
        assert a[k].dtype == torch.bfloat16 == b[k].dtype, k
        # PEFT rounds the delta s·B·A to bf16 and then the sum; Orion rounds W + s·B·A
        # once (from fp32), so the two may differ by one bf16 step, never more
        ulps = _bf16_ulps(a[k], b[k])
        assert ulps.max() <= 1, k
        changed += int((ulps > 0).sum())
    n = sum(v.numel() for v in a.values())
    assert changed < n // 100          # one-step differences are rare double roundings
    # the unadapted tensors are the base's, bit for bit
    assert torch.equal(a["model.norm.weight"], base.state_dict()["model.norm.weight"])


@pytest.mark.slow
def test_gpt2_adapter_fuses_into_a_gpt2_folder_equal_to_peft(tiny_gpt2_dir, tmp_path):
    """Another architecture's adapter (GPT-2: Conv1D layers, PEFT's fan_in_fan_out):
    fuse writes a GPT-2 folder transformers loads, equal to PEFT's merge_and_unload."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    ad = peft_adapter(tiny_gpt2_dir, tmp_path / "ad", seed=5, r=4,
                      targets=("c_attn", "c_fc"))
    assert main(["fuse", "--model", str(tiny_gpt2_dir), "--adapter-path", str(ad),
                 "--out", str(tmp_path / "fused")]) == 0
    fused = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "fused",
                                                              dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir,
                                                             dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(base, ad).merge_and_unload()
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        np.testing.assert_allclose(fused(ids).logits.numpy(), merged(ids).logits.numpy(),
                                   atol=1e-3)
