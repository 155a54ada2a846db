"""A GGUF file as a model: its metadata as the config.json of the architecture it
names, and its tensors under transformers' parameter names.

    general.architecture   llama, qwen2, qwen3, gpt2 (ARCHITECTURES); others are
                           refused by name
    <arch>.*               the sizes (embedding_length, block_count, head counts, ...)

llama.cpp's converter permutes Llama's q and k projections (its rotary kernel pairs
adjacent channels, transformers' pairs the two halves of a head); `GGUFWeights` undoes
that on rows, so quantized blocks stay whole. Every tensor the architecture expects
must be present, nothing else may be (a name outside the expected set is an error
naming it), each of the expected shape, and every value a tensor can dequantize to must
be finite and within fp16's range.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import ModelLoadError
from orion.formats import gguf_quants as GQ
from orion.formats.gguf import GGUFFile, GGUFTensor
from orion.formats.safetensors import FP16_MAX
from orion.ir.quant import QuantTensor
from orion.models.architecture import Architecture
from orion.models.quantized import gguf_tensor
from orion.models.weights import Rows

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gpt2")
ROWS_AT_ONCE = 4096

_LLAMA_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LLAMA_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
_GPT2_LAYER = {"ln_1.weight": "attn_norm.weight", "ln_1.bias": "attn_norm.bias",
               "attn.c_attn.weight": "attn_qkv.weight", "attn.c_attn.bias": "attn_qkv.bias",
               "attn.c_proj.weight": "attn_output.weight",
               "attn.c_proj.bias": "attn_output.bias",
               "ln_2.weight": "ffn_norm.weight", "ln_2.bias": "ffn_norm.bias",
               "mlp.c_fc.weight": "ffn_up.weight", "mlp.c_fc.bias": "ffn_up.bias",
               "mlp.c_proj.weight": "ffn_down.weight", "mlp.c_proj.bias": "ffn_down.bias"}
_GPT2_GLOBAL = {"transformer.wte.weight": "token_embd.weight",
                "transformer.wpe.weight": "position_embd.weight",
                "transformer.ln_f.weight": "output_norm.weight",
                "transformer.ln_f.bias": "output_norm.bias", "lm_head.weight": "output.weight"}


class _Meta:
    """Typed reads of `<arch>.<key>` with errors naming the key."""

    def __init__(self, f: GGUFFile, arch: str) -> None:
        self.f, self.arch = f, arch

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        full = f"{self.arch}.{key}"
        v = self.f.metadata.get(full, default)
        if v is None:
            raise ModelLoadError(f"{self.f.path}: {full} is missing")
        ok = isinstance(v, kind) and not isinstance(v, bool) if kind is int else \
            isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok:
            want = "an integer" if kind is int else "a number"
            raise ModelLoadError(f"{self.f.path}: {full} is {v!r}, not {want}")
        return v


def gguf_config(f: GGUFFile) -> dict[str, Any]:
    """The config.json (transformers' field names) of the file's architecture."""
    arch = f.string("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{f.path}: general.architecture {arch!r} is not supported "
                             f"(Orion reads {', '.join(ARCHITECTURES)} GGUF files)")
    m = _Meta(f, arch)
    if "token_embd.weight" not in f.tensors:
        raise ModelLoadError(f"{f.path}: no token_embd.weight")
    vocab, dim = (f.tensors["token_embd.weight"].shape + (0,))[:2]
    tied = "output.weight" not in f.tensors
    heads = m.get("attention.head_count", int)
    common = {"vocab_size": vocab, "tie_word_embeddings": tied}
    if arch == "gpt2":
        return {"model_type": "gpt2", "n_embd": m.get("embedding_length", int),
                "n_layer": m.get("block_count", int), "n_head": heads,
                "n_inner": m.get("feed_forward_length", int),
                "n_positions": m.get("context_length", int),
                "layer_norm_epsilon": m.get("attention.layer_norm_epsilon", float),
                **common}
    for refused in ("rope.scaling.type", "attention.sliding_window", "rope.dimension_sections"):
        v = f.metadata.get(f"{arch}.{refused}")
        if v not in (None, "none"):
            raise ModelLoadError(f"{f.path}: {arch}.{refused} = {v!r} is not supported")
    if "rope_freqs.weight" in f.tensors:
        raise ModelLoadError(f"{f.path}: rope_freqs.weight (Llama 3's rope scaling as "
                             "frequency factors) is not supported")
    dim = m.get("embedding_length", int)
    head_dim = m.get("attention.key_length", int, dim // heads)
    if m.get("attention.value_length", int, head_dim) != head_dim:
        raise ModelLoadError(f"{f.path}: {arch}.attention.value_length differs from "
                             "key_length")
    rope_dims = m.get("rope.dimension_count", int, head_dim)
    if rope_dims != head_dim:
        raise ModelLoadError(f"{f.path}: {arch}.rope.dimension_count {rope_dims} rotates part "
                             f"of a head of {head_dim} (not supported)")
    bias = "blk.0.attn_q.bias" in f.tensors
    out = {"model_type": arch, "hidden_size": dim, "num_hidden_layers": m.get("block_count", int),
           "intermediate_size": m.get("feed_forward_length", int),
           "num_attention_heads": heads,
           "num_key_value_heads": m.get("attention.head_count_kv", int, heads),
           "head_dim": head_dim, "max_position_embeddings": m.get("context_length", int),
           "rms_norm_eps": m.get("attention.layer_norm_rms_epsilon", float),
           "rope_theta": m.get("rope.freq_base", float, 10000.0), "hidden_act": "silu",
           **common}
    if arch == "qwen2":
        out["use_sliding_window"] = False
    else:
        out["attention_bias"] = bias
    return out


def gguf_names(arch: Architecture) -> dict[str, str]:
    """Parameter name -> GGUF tensor name, for every parameter of `arch`."""
    layer, glob = (_GPT2_LAYER, _GPT2_GLOBAL) if arch.model_type == "gpt2" else \
        (_LLAMA_LAYER, _LLAMA_GLOBAL)
    out: dict[str, str] = {}
    for name in arch.parameters():
        if name in glob:
            out[name] = glob[name]
            continue
        for i in range(arch.args.n_layers):
            prefix = arch.layer_prefix(i)
            if name.startswith(prefix) and name[len(prefix):] in layer:
                out[name] = f"blk.{i}.{layer[name[len(prefix):]]}"
                break
        else:
            raise ModelLoadError(f"{arch.model_type}: no GGUF name for {name}")
    return out


def _rope_rows(n_heads: int, rows: int) -> np.ndarray:
    """The rows of llama.cpp's permuted q (or k) that hold transformers' rows in order:
    within each head, llama.cpp interleaves the two halves."""
    hd = rows // n_heads
    return np.arange(rows).reshape(n_heads, hd // 2, 2).transpose(0, 2, 1).reshape(-1)


@dataclass(frozen=True)
class GGUFEntry:
    tensor: GGUFTensor
    rows: np.ndarray | None     # the stored rows in parameter order (None: as stored)


class GGUFWeights:
    """The WeightSource of a checked GGUF file (see `open_gguf`)."""

    def __init__(self, f: GGUFFile, entries: dict[str, GGUFEntry]) -> None:
        self.file, self.entries = f, entries

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].tensor.shape

    def entry(self, name: str) -> GGUFEntry:
        return self.entries[name]

    def quant(self, name: str, rows: slice | None = None) -> QuantTensor | None:
        """The parameter (or a run of its rows) as the device holds it compressed
        (None: a float type)."""
        t = self.entries[name].tensor
        if len(t.shape) != 2:
            return None
        lo, hi, _ = (rows or slice(None)).indices(t.shape[0])
        return gguf_tensor(t.type, lambda idx: self.file.read_rows(t.name, idx),
                           self.stored_rows(name, slice(lo, hi)), (hi - lo, t.shape[1]))

    def stored_rows(self, name: str, rows: Rows = None) -> np.ndarray:
        """The indices of the stored rows that hold the parameter's rows `rows`."""
        e = self.entries[name]
        n = e.tensor.shape[0]
        if e.rows is not None:
            return e.rows if rows is None else e.rows[rows]
        if rows is None:
            return np.arange(n)
        if isinstance(rows, slice):
            return np.arange(*rows.indices(n))
        # stored in order: the rows themselves (no arange of the whole vocabulary a
        # decode step's lookup), negative ones counted from the end as indexing would
        idx = np.asarray(rows, np.int64)
        return np.where(idx < 0, idx + n, idx)

    def _read(self, name: str, rows: Rows) -> np.ndarray:
        e = self.entries[name]
        t = e.tensor
        if len(t.shape) == 1:
            out = GQ.dequantize(t.type, self.file.read_rows(t.name, np.array([0])).reshape(-1),
                                 t.shape)
            return out[self.stored_rows(name, rows)]
        idx = self.stored_rows(name, rows)
        out = np.empty((idx.size, t.shape[1]), np.float32)
        for lo in range(0, idx.size, ROWS_AT_ONCE):
            part = idx[lo: lo + ROWS_AT_ONCE]
            out[lo: lo + part.size] = GQ.dequantize(t.type, self.file.read_rows(t.name, part),
                                                    (part.size, t.shape[1]))
        return out

    def fp32(self, name: str, rows: Rows = None) -> np.ndarray:
        return self._read(name, rows)

    def fp16(self, name: str, rows: Rows = None) -> np.ndarray:
        return self.fp32(name, rows).astype(np.float16)

    def rows_fp32(self, name: str, ids: np.ndarray | slice) -> np.ndarray:
        return self._read(name, np.asarray(ids) if not isinstance(ids, slice) else ids)

    def parameter_count(self) -> int:
        return sum(int(np.prod(e.tensor.shape)) for e in self.entries.values())

    def fingerprint(self) -> str:
        """The file's identity and tensor headers, and which stored rows each parameter
        takes (the file's q/k rows are permuted back): no tensor is read."""
        h = hashlib.sha256(self.file.fingerprint().encode())
        for name in sorted(self.entries):
            e = self.entries[name]
            h.update(repr((name, e.tensor.name)).encode())
            if e.rows is not None:
                h.update(np.ascontiguousarray(e.rows, np.int64))
        return h.hexdigest()

    def close(self) -> None:
        self.file.close()


def open_gguf(arch: Architecture, f: GGUFFile) -> GGUFWeights:
    """The file's tensors checked whole against `arch` (see the module docstring)."""
    names = gguf_names(arch)
    if arch.args.tie_embeddings:
        names.pop(arch.head_name, None)
    expected = set(names.values())
    extra = sorted(set(f.tensors) - expected)
    missing = sorted(n for n in names.values() if n not in f.tensors)
    if missing or extra:
        raise ModelLoadError(f"{f.path}: the tensors do not match the metadata "
                             f"({arch.model_type}, {arch.args.n_layers} layers): missing "
                             f"{missing[:5]}, unexpected {extra[:5]}")
    shapes = arch.parameters()
    permute = arch.model_type == "llama"
    entries: dict[str, GGUFEntry] = {}
    for name, tname in names.items():
        t = f.tensors[tname]
        if t.shape != shapes[name]:
            raise ModelLoadError(f"{f.path}: tensor {tname} has shape {list(t.shape)}, the "
                                 f"metadata implies {list(shapes[name])}")
        bound = max(GQ.value_bound(t.type, part) for part in f.raw_chunks(tname))
        if not bound <= FP16_MAX:
            raise ModelLoadError(f"{f.path}: tensor {tname} holds values that are not "
                                 "finite or outside fp16's range (|x| > 65504)")
        rows = None
        if permute and tname.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight",
                                       "attn_k.bias")):
            heads = arch.args.n_heads if ".attn_q." in tname else arch.args.n_kv_heads
            rows = _rope_rows(heads, t.shape[0])
        entries[name] = GGUFEntry(t, rows)
    f.close()
    return GGUFWeights(f, entries)


def open_gguf_model(path: Path) -> tuple[dict[str, Any], GGUFFile]:
    """The file parsed and its config (the architecture is built by the caller)."""
    f = GGUFFile(path)
    return gguf_config(f), f
