"""llama2.c checkpoints (`.bin`) in every layout its export.py writes, and its
tokenizer.bin.

    legacy      7 int32 (dim, hidden, layers, heads, kv_heads, vocab, seq; vocab < 0
                means an untied classifier), then fp32 tensors grouped by kind, the
                RoPE tables, and the classifier if untied
    version 1   256-byte header: magic "ak42", int32 version, the 7 int32, a uint8
                shared-classifier flag; fp32 norms first, then the matrices
    version 2   as version 1 plus an int32 group size; norms fp32, matrices Q8_0
                (int8 values, then one fp32 scale per group) - read only

llama2.c stores q/k rows as interleaved (re, im) pairs; Orion, like Hugging Face,
uses rotate-half order, so rows are permuted when read and permuted back when written.
Every length read from the file is checked against the file size before use.

A checkpoint reads as what a Hugging Face Llama folder holds: a config.json dict
(`model_type` "llama") and tensors under transformers' names, which the llama
architecture then checks like any folder's.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import GIB, MAX_TOKENIZER_BYTES, UnsafeFileError, read_bytes

Weights = dict[str, np.ndarray]
EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"

MAGIC = 0x616B3432  # "ak42"
HEADER_BYTES = 256
LEGACY_HEADER_BYTES = 28
MAX_SEQ_LEN = 1 << 17            # the longest context a header may claim (Llama 3.1's)
MAX_CHECKPOINT_BYTES = 256 * GIB   # read whole; its size must match the header exactly

def layer_key(i: int, suffix: str) -> str:
    return f"model.layers.{i}.{suffix}"


# llama2.c kind -> the per-layer suffix under transformers' names
ATT_NORM, FFN_NORM = "input_layernorm.weight", "post_attention_layernorm.weight"
MATRICES = (
    ("wq", "self_attn.q_proj.weight"),
    ("wk", "self_attn.k_proj.weight"),
    ("wv", "self_attn.v_proj.weight"),
    ("wo", "self_attn.o_proj.weight"),
    ("w1", "mlp.gate_proj.weight"),
    ("w2", "mlp.down_proj.weight"),
    ("w3", "mlp.up_proj.weight"),
)


def interleaved_to_half(w: np.ndarray, n_heads: int) -> np.ndarray:
    """q/k rows from llama2.c's (re, im) pairs to rotate-half order (HF's permute)."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(0, 2, 1, 3) \
        .reshape(rows, cols)


def half_to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(0, 2, 1, 3) \
        .reshape(rows, cols)


class _Reader:
    def __init__(self, data: memoryview, where: str) -> None:
        self.data, self.pos, self.where = data, 0, where

    def take(self, nbytes: int) -> memoryview:
        if nbytes < 0 or self.pos + nbytes > len(self.data):
            raise ModelLoadError(f"{self.where}: truncated at byte {self.pos} (needs {nbytes} "
                                 f"more, file has {len(self.data)})")
        out = self.data[self.pos:self.pos + nbytes]
        self.pos += nbytes
        return out

    def f32(self, *shape: int) -> np.ndarray:
        n = int(np.prod(shape))
        return np.frombuffer(self.take(4 * n), np.float32).reshape(shape).copy()

    def q80(self, group: int, *shape: int) -> np.ndarray:
        n = int(np.prod(shape))
        if n % group:
            raise ModelLoadError(f"{self.where}: tensor of {n} values is not a multiple of "
                                 f"group size {group}")
        q = np.frombuffer(self.take(n), np.int8).astype(np.float32)
        s = np.frombuffer(self.take(4 * (n // group)), np.float32)
        return (q.reshape(-1, group) * s[:, None]).reshape(shape)


@dataclass(frozen=True)
class Shape:
    """The seven numbers of a llama2.c header, and whether the classifier is tied."""

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def ints(self) -> list[int]:
        return [self.dim, self.hidden_dim, self.n_layers, self.n_heads, self.n_kv_heads,
                self.vocab_size, self.max_seq_len]

    def hf_config(self) -> dict[str, Any]:
        """The config.json of the same model (llama2.c's RMSNorm eps and RoPE base)."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": self.dim, "intermediate_size": self.hidden_dim,
                "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
                "num_key_value_heads": self.n_kv_heads, "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_seq_len, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "tie_word_embeddings": self.tie_embeddings,
                "hidden_act": "silu"}

    @classmethod
    def of_config(cls, config: dict[str, Any]) -> Shape:
        """The header of a Llama config.json (one llama2.c can hold: full-size heads,
        no biases, RoPE unscaled with base 10000)."""
        heads = config["num_attention_heads"]
        if config.get("head_dim") not in (None, config["hidden_size"] // heads) or any(
                config.get(k) for k in ("attention_bias", "rope_scaling")) or \
                config.get("rope_theta", 10000.0) != 10000.0:
            raise ModelLoadError("llama2.c holds a plain Llama (head_dim = dim / heads, no "
                                 "biases, RoPE base 10000 unscaled)")
        return cls(config["hidden_size"], config["intermediate_size"],
                   config["num_hidden_layers"], heads,
                   config.get("num_key_value_heads", heads), config["vocab_size"],
                   config["max_position_embeddings"], bool(config["tie_word_embeddings"]))


def _config(ints: Sequence[int], tied: bool, where: str) -> Shape:
    dim, hidden, layers, heads, kv_heads, vocab, seq = ints
    if min(dim, hidden, layers, heads, kv_heads, vocab, seq) <= 0:
        raise ModelLoadError(f"{where}: header {list(ints)} has a non-positive field")
    if heads > dim or kv_heads > heads or layers > 4096 or seq > MAX_SEQ_LEN:
        raise ModelLoadError(f"{where}: header {list(ints)} is not a Llama shape (heads > dim, "
                             f"kv_heads > heads, over 4096 layers or a context over "
                             f"{MAX_SEQ_LEN})")
    if dim % heads or heads % kv_heads or (dim // heads) % 2:
        raise ModelLoadError(f"{where}: header {list(ints)}: dim must divide into heads of "
                             "even size, and kv_heads divide heads")
    return Shape(dim, hidden, layers, heads, kv_heads, vocab, seq, tied)


def expected_bytes(cfg: Shape, version: int, group: int = 0) -> int:
    """The exact size of a llama2.c checkpoint of this config and export version
    (0: legacy), computed before any tensor is read: a header relabelled to another
    version, or lying about the sizes, cannot match it."""
    d, L, v = cfg.dim, cfg.n_layers, cfg.vocab_size
    mats = [v * d] + [r * c for r, c in _shapes(cfg).values()] * L
    if not cfg.tie_embeddings:
        mats.append(v * d)
    norms = (2 * L + 1) * d
    if version == 0:
        rope = 2 * cfg.max_seq_len * (cfg.head_dim // 2)
        return LEGACY_HEADER_BYTES + 4 * (norms + sum(mats) + rope)
    if version == 1:
        return HEADER_BYTES + 4 * (norms + sum(mats))
    return HEADER_BYTES + 4 * norms + sum(n + 4 * (n // group) for n in mats)


def _check_size(where: str, size: int, cfg: Shape, version: int, group: int = 0) -> None:
    want = expected_bytes(cfg, version, group)
    if size != want:
        kind = "a legacy" if version == 0 else f"a version-{version}"
        raise ModelLoadError(f"{where}: {size} bytes, but {kind} llama2.c checkpoint with this "
                             f"header has {want} (truncated, padded, or a header relabelled "
                             "to another version)")


def _shapes(cfg: Shape) -> dict[str, tuple[int, int]]:
    d, h, kv = cfg.dim, cfg.hidden_dim, cfg.kv_dim
    return {"wq": (d, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, d),
            "w1": (h, d), "w2": (d, h), "w3": (h, d)}


def _from_llama2c(cfg: Shape, raw: Mapping[str, list[np.ndarray] | np.ndarray],
                  where: str) -> Weights:
    out: Weights = {EMBED: raw["tok"], FINAL_NORM: raw["norm"]}  # type: ignore[dict-item]
    for i in range(cfg.n_layers):
        out[layer_key(i, ATT_NORM)] = raw["att_norm"][i]
        out[layer_key(i, FFN_NORM)] = raw["ffn_norm"][i]
        for kind, suffix in MATRICES:
            w = raw[kind][i]
            if kind == "wq":
                w = interleaved_to_half(w, cfg.n_heads)
            elif kind == "wk":
                w = interleaved_to_half(w, cfg.n_kv_heads)
            out[layer_key(i, suffix)] = w
    if not cfg.tie_embeddings:
        out[LM_HEAD] = raw["cls"]  # type: ignore[assignment]
    return out


def read_llama2c(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Weights]:
    """A llama2.c checkpoint of any export version (see the module docstring): its
    config.json dict and its tensors under transformers' names."""
    where = os.fspath(path)
    try:
        data = memoryview(read_bytes(path, max_bytes=MAX_CHECKPOINT_BYTES))
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    r = _Reader(data, where)
    if len(data) < 28:
        raise ModelLoadError(f"{where}: {len(data)} bytes is too short for a llama2.c header")
    (magic,) = struct.unpack_from("<I", data, 0)
    if magic != MAGIC:
        return _read_legacy(r)
    if len(data) < HEADER_BYTES:
        raise ModelLoadError(f"{where}: truncated version header")
    (version,) = struct.unpack_from("<i", data, 4)
    ints = struct.unpack_from("<7i", data, 8)
    tied = bool(data[36])
    if version not in (1, 2):
        raise ModelLoadError(f"{where}: llama2.c export version {version} is not supported "
                             "(1 and 2 are)")
    cfg = _config(ints, tied, where)
    group = struct.unpack_from("<i", data, 37)[0] if version == 2 else 0
    if version == 2 and (group <= 0 or cfg.dim % group):
        raise ModelLoadError(f"{where}: bad Q8_0 group size {group}")
    _check_size(where, len(data), cfg, version, group)
    r.pos = HEADER_BYTES
    L, d = cfg.n_layers, cfg.dim
    raw: dict[str, list[np.ndarray] | np.ndarray] = {
        "att_norm": [r.f32(d) for _ in range(L)],
        "ffn_norm": [r.f32(d) for _ in range(L)],
        "norm": r.f32(d),
    }

    def mat(*shape: int) -> np.ndarray:
        return r.f32(*shape) if version == 1 else r.q80(group, *shape)

    raw["tok"] = mat(cfg.vocab_size, d)
    for kind, shape in _shapes(cfg).items():
        raw[kind] = [mat(*shape) for _ in range(L)]
    if not tied:
        raw["cls"] = mat(cfg.vocab_size, d)
    return cfg.hf_config(), _from_llama2c(cfg, raw, where)


def _read_legacy(r: _Reader) -> tuple[dict[str, Any], Weights]:
    ints = list(struct.unpack("<7i", r.take(28)))
    tied = ints[5] > 0
    ints[5] = abs(ints[5])
    cfg = _config(ints, tied, r.where)
    _check_size(r.where, len(r.data), cfg, 0)
    L, d = cfg.n_layers, cfg.dim
    shapes = _shapes(cfg)
    raw: dict[str, list[np.ndarray] | np.ndarray] = {"tok": r.f32(cfg.vocab_size, d)}
    raw["att_norm"] = [r.f32(d) for _ in range(L)]
    for kind in ("wq", "wk", "wv", "wo"):
        raw[kind] = [r.f32(*shapes[kind]) for _ in range(L)]
    raw["ffn_norm"] = [r.f32(d) for _ in range(L)]
    for kind in ("w1", "w2", "w3"):
        raw[kind] = [r.f32(*shapes[kind]) for _ in range(L)]
    raw["norm"] = r.f32(d)
    r.take(2 * 4 * cfg.max_seq_len * cfg.head_dim // 2)  # freq_cis_real, freq_cis_imag
    if not tied:
        raw["cls"] = r.f32(cfg.vocab_size, d)
    return cfg.hf_config(), _from_llama2c(cfg, raw, r.where)


def _llama2c_layers(cfg: Shape, w: Mapping[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    out: dict[str, list[np.ndarray]] = {"att_norm": [], "ffn_norm": []}
    for i in range(cfg.n_layers):
        out["att_norm"].append(w[layer_key(i, ATT_NORM)])
        out["ffn_norm"].append(w[layer_key(i, FFN_NORM)])
        for kind, suffix in MATRICES:
            m = w[layer_key(i, suffix)]
            if kind == "wq":
                m = half_to_interleaved(m, cfg.n_heads)
            elif kind == "wk":
                m = half_to_interleaved(m, cfg.n_kv_heads)
            out.setdefault(kind, []).append(m)
    return out


def write_llama2c(path: str | os.PathLike[str], config: dict[str, Any],
                  weights: Mapping[str, np.ndarray], version: int = 1) -> None:
    """Writes a legacy (version=0) or version-1 (fp32) llama2.c checkpoint of a Llama
    config.json dict and its tensors (transformers' names), atomically."""
    from orion.atomic import atomic_write_bytes

    cfg = Shape.of_config(config)
    w = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    layers = _llama2c_layers(cfg, w)
    ints = cfg.ints()
    parts: list[bytes] = []
    if version == 1:
        head = struct.pack("<Ii7iB", MAGIC, 1, *ints, int(cfg.tie_embeddings))
        parts.append(head + b"\0" * (HEADER_BYTES - len(head)))
        tensors = [*layers["att_norm"], *layers["ffn_norm"], w[FINAL_NORM], w[EMBED]]
        for kind, _ in MATRICES:
            tensors += layers[kind]
    elif version == 0:
        if not cfg.tie_embeddings:
            ints[5] = -ints[5]
        parts.append(struct.pack("<7i", *ints))
        tensors = [w[EMBED], *layers["att_norm"]]
        for kind in ("wq", "wk", "wv", "wo"):
            tensors += layers[kind]
        tensors += layers["ffn_norm"]
        for kind in ("w1", "w2", "w3"):
            tensors += layers[kind]
        tensors.append(w[FINAL_NORM])
        half = cfg.head_dim // 2
        inv = 1.0 / 10000.0 ** (np.arange(0, cfg.head_dim, 2)[:half] / cfg.head_dim)
        ang = np.outer(np.arange(cfg.max_seq_len), inv)
        tensors += [np.cos(ang), np.sin(ang)]
    else:
        raise InvalidArgumentError(f"llama2.c export version {version} cannot be written "
                                   "(0 or 1)")
    if not cfg.tie_embeddings:
        tensors.append(w[LM_HEAD])
    parts += [np.ascontiguousarray(t, np.float32).tobytes() for t in tensors]
    atomic_write_bytes(path, b"".join(parts))


def write_tokenizer_bin(path: str | os.PathLike[str], pieces: Sequence[tuple[bytes, float]]
                        ) -> None:
    """llama2.c's tokenizer.bin: int32 max piece length, then (fp32 score, int32 length,
    bytes) per piece, as its tokenizer.py exports from a SentencePiece model."""
    from orion.atomic import atomic_write_bytes

    out = [struct.pack("<i", max((len(b) for b, _ in pieces), default=0))]
    for b, score in pieces:
        out.append(struct.pack("<fi", float(score), len(b)) + b)
    atomic_write_bytes(path, b"".join(out))


def read_tokenizer_bin(path: str | os.PathLike[str], vocab_size: int
                       ) -> list[tuple[bytes, float]]:
    where = os.fspath(path)
    try:
        r = _Reader(memoryview(read_bytes(path, max_bytes=MAX_TOKENIZER_BYTES)), where)
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    struct.unpack("<i", r.take(4))
    out = []
    for _ in range(vocab_size):
        score, n = struct.unpack("<fi", r.take(8))
        out.append((bytes(r.take(n)), score))
    return out
