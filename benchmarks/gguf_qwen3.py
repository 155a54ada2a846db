"""A Qwen3 Hugging Face folder (safetensors, tokenizer.json) as a GGUF f16 file for
llama.cpp, written with the `gguf` package alone: its tensor-name map
(`gguf.get_tensor_name_map`), its BPE vocabulary and special-token readers
(`gguf.vocab`) and its writer, with the keys llama.cpp's convert_hf_to_gguf.py writes
for Qwen3 (that script ships with llama.cpp's sources, not with any installed package).
As there: no q/k permutation (llama.cpp runs Qwen3's RoPE in the NeoX layout, as HF
does), matrices in f16, norms in f32, the vocabulary padded to the config's size, and
the pre-tokenizer named "qwen2".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_qwen3_gguf(folder: Path, out: Path) -> Path:
    import gguf

    cfg = json.loads((folder / "config.json").read_text())
    n_layers = cfg["num_hidden_layers"]
    writer = gguf.GGUFWriter(str(out), "qwen3")
    writer.add_block_count(n_layers)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    # transformers >= 5 writes RoPE's base inside rope_parameters, older ones at the top
    writer.add_rope_freq_base(cfg.get("rope_parameters", {}).get("rope_theta")
                              or cfg["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _add_vocab(writer, folder, cfg["vocab_size"])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, n_layers)
    for hf_name, array in sorted(_load_f32(folder).items()):
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"{folder}/model.safetensors: no GGUF name for {hf_name}")
        writer.add_tensor(name, array.astype(np.float16 if array.ndim == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _load_f32(folder: Path) -> dict[str, np.ndarray]:
    """The folder's tensors as float32 (read by torch: numpy has no bf16)."""
    import torch
    from safetensors.torch import load_file as load_torch

    return {k: v.to(torch.float32).numpy()
            for k, v in load_torch(str(folder / "model.safetensors")).items()}


def _add_vocab(writer, folder: Path, vocab_size: int) -> None:
    import gguf

    vocab = gguf.vocab.BpeVocab(folder)
    tokens, types = [], []
    for text, _, kind in vocab.all_tokens():
        tokens.append(text)
        types.append(kind)
    for i in range(len(tokens), vocab_size):       # the embedding has unused rows past it
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size).add_to_gguf(writer)
