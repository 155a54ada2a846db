"""Test fixtures: a Hugging Face folder written as a GGUF file with gguf-py's writer, as
llama.cpp's convert_hf_to_gguf.py lays it out (its tensor names, Llama's q/k rows
permuted for its rotary kernel, norms in F32), each matrix in a chosen GGML type.

Q8_0 and Q4_0 blocks come from gguf-py's own quantizer; gguf-py has none for the K
types, so Q4_K and Q6_K blocks are packed here from a plain min/max rule (valid blocks
that gguf-py and llama.cpp dequantize; not llama.cpp's error-minimizing search).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

LLAMA = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
          "lm_head": "output"}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's two halves interleaved."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _fp16_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float16).view(np.uint8).reshape(*x.shape, 2)


def q4_k_blocks(w: np.ndarray) -> np.ndarray:
    """fp32 [rows, cols] -> Q4_K bytes [rows, cols / 256 * 144]."""
    g = w.reshape(-1, 8, 32).astype(np.float32)
    lo, hi = np.minimum(g.min(axis=2), 0), g.max(axis=2)
    scale, mins = (hi - lo) / 15, -lo
    d = np.maximum(scale.max(axis=1), 1e-8) / 63
    dmin = np.maximum(mins.max(axis=1), 1e-8) / 63
    d16, dm16 = d.astype(np.float16), dmin.astype(np.float16)
    sc = np.clip(np.rint(scale / d16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(mins / dm16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    step = d16.astype(np.float32)[:, None] * sc
    off = dm16.astype(np.float32)[:, None] * mn
    q = np.clip(np.rint((g + off[:, :, None]) / np.where(step, step, 1)[:, :, None]), 0, 15)
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    packed = np.zeros((g.shape[0], 12), np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    out = np.concatenate([_fp16_bytes(d16), _fp16_bytes(dm16), packed, qs], axis=1)
    return out.reshape(w.shape[0], -1)


def q6_k_blocks(w: np.ndarray) -> np.ndarray:
    """fp32 [rows, cols] -> Q6_K bytes [rows, cols / 256 * 210]."""
    g = w.reshape(-1, 16, 16).astype(np.float32)
    amax = np.abs(g).max(axis=2) / 31
    d = np.maximum(np.abs(amax).max(axis=1), 1e-8) / 127
    d16 = d.astype(np.float16)
    sc = np.clip(np.rint(amax / d16.astype(np.float32)[:, None]), -128, 127).astype(np.int8)
    step = d16.astype(np.float32)[:, None] * sc
    q = np.clip(np.rint(g / np.where(step, step, 1)[:, :, None]) + 32, 0, 63).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)                       # [block, half, quarter, 32]
    lo, hi = q & 0x0F, q >> 4
    ql = (lo[:, :, 0:2] | (lo[:, :, 2:4] << 4)).reshape(-1, 128)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6))
    out = np.concatenate([ql, qh.reshape(-1, 64), sc.view(np.uint8), _fp16_bytes(d16)],
                         axis=1)
    return out.reshape(w.shape[0], -1)


def encode(w: np.ndarray, qtype: str) -> tuple[np.ndarray, object]:
    """(array for GGUFWriter.add_tensor, its raw dtype or None)."""
    T = gguf.GGMLQuantizationType
    if qtype == "F32":
        return w.astype(np.float32), None
    if qtype == "F16":
        return w.astype(np.float16), None
    if qtype in ("Q8_0", "Q4_0", "BF16"):
        return gguf.quants.quantize(w.astype(np.float32), T[qtype]), T[qtype]
    blocks = {"Q4_K": q4_k_blocks, "Q6_K": q6_k_blocks}[qtype](w)
    return blocks, T[qtype]


def write_gguf(folder: Path, out: Path, qtype: str = "Q8_0", *, embed_type: str | None = None,
               head_type: str | None = None, vocab: dict | None = None) -> Path:
    """The HF folder's model (llama / qwen2 / qwen3) as GGUF; matrices in `qtype`, the
    embedding in `embed_type` and the classifier in `head_type` (default: qtype)."""
    from orion.models.registry import load_hf_arrays

    cfg = json.loads((folder / "config.json").read_text())
    arch, arrays = load_hf_arrays(folder)
    a = arch.args
    name = arch.model_type
    w = gguf.GGUFWriter(str(out), name)
    w.add_block_count(a.n_layers)
    w.add_context_length(a.max_positions)
    w.add_embedding_length(a.dim)
    w.add_feed_forward_length(a.hidden_dim)
    w.add_head_count(a.n_heads)
    w.add_head_count_kv(a.n_kv_heads)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.head_dim)
    w.add_rope_dimension_count(a.head_dim)
    w.add_layer_norm_rms_eps(a.norm_eps)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_vocab_size(a.vocab_size)      # llama.cpp sizes the embedding from it
    for key, value in (vocab or {"tokenizer.ggml.model": "no_vocab"}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    for hf, array in arrays.items():
        module, kind = hf.rsplit(".", 1)
        if module in GLOBAL:
            gname = GLOBAL[module]
        else:
            _, _, layer, rest = module.split(".", 3)
            gname = f"blk.{int(layer)}.{LLAMA[rest]}"
        if name == "llama" and module.endswith(("q_proj", "k_proj")):
            array = permute(array, a.n_heads if module.endswith("q_proj") else a.n_kv_heads)
        t = qtype
        if gname == "token_embd":
            t = embed_type or qtype
        elif gname == "output":
            t = head_type or qtype
        if array.ndim == 1:
            t = "F32"
        data, raw = encode(array, t)
        w.add_tensor(f"{gname}.{kind}", data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def vocab_metadata(tokenizer_json: Path, pre: str, template: str | None = None,
                   bos: str | None = None, eos: str | None = None) -> dict:
    """The tokenizer keys convert_hf_to_gguf.py writes for a byte-level BPE
    tokenizer.json: tokens by id, merges as "a b", control / user-defined types for the
    added tokens, the pre-tokenizer's name, special ids, the chat template."""
    data = json.loads(Path(tokenizer_json).read_text())
    vocab = dict(data["model"]["vocab"])
    added = {t["content"]: t for t in data.get("added_tokens", [])}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [5] * n                       # unused ids: llama.cpp's UNUSED
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = 1
    for t in added.values():
        types[t["id"]] = 3 if t.get("special") else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges}
    if bos is not None:
        meta["tokenizer.ggml.bos_token_id"] = vocab[bos]
    if eos is not None:
        meta["tokenizer.ggml.eos_token_id"] = vocab[eos]
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return meta
