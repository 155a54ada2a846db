"""A GPT-2 Hugging Face folder (safetensors) as a GGUF file for llama.cpp, written with the
`gguf` package's writer: the same tensors, names and layout as llama.cpp's own
convert_hf_to_gguf.py gives GPT-2 (Conv1D weights transposed to [out, in], matrices in
fp16, norms and biases in fp32, the LM head tied to the embedding). No tokenizer is
written ("no_vocab"): the benchmark feeds token ids, as it does to Orion and PyTorch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LAYER_NAMES = {           # HF suffix after "transformer.h.{i}." -> GGUF suffix after "blk.{i}."
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")   # stored [in, out]


def gguf_name(hf_name: str) -> tuple[str, bool] | None:
    """The GGUF tensor name of an HF GPT-2 tensor and whether it is a Conv1D weight;
    None for buffers llama.cpp does not read (the causal mask)."""
    name = hf_name.removeprefix("transformer.")
    if name.endswith((".attn.bias", ".attn.masked_bias")):
        return None
    top = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
           "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}
    if name in top:
        return top[name], False
    if not name.startswith("h."):
        return None                      # lm_head.weight: tied to wte
    _, layer, rest = name.split(".", 2)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{int(layer)}.{LAYER_NAMES[module]}.{kind}", module in CONV1D and kind == "weight"


def write_gpt2_gguf(folder: Path, out: Path) -> Path:
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    d = cfg["n_embd"]
    writer = gguf.GGUFWriter(str(out), "gpt2")
    writer.add_block_count(cfg["n_layer"])
    writer.add_context_length(cfg.get("n_ctx") or cfg["n_positions"])
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(cfg.get("n_inner") or 4 * d)
    writer.add_head_count(cfg["n_head"])
    writer.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("no_vocab")
    writer.add_vocab_size(cfg["vocab_size"])
    for hf_name, array in sorted(load_file(str(folder / "model.safetensors")).items()):
        mapped = gguf_name(hf_name)
        if mapped is None:
            continue
        name, conv1d = mapped
        data = np.ascontiguousarray(array.T if conv1d else array)
        data = data.astype(np.float16 if data.ndim == 2 else np.float32)
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
