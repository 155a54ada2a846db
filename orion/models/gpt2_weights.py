"""GPT-2 config and weights from a Hugging Face model folder.

`config.json` + `model.safetensors` (or shards), the layout `transformers` saves, in
fp32, fp16 or bf16. The tensors stay memory-mapped (`orion.formats.safetensors`):
no torch, never pickle, and no copy of the model. A layer is read when its programs
are built, in fp16 (the device's type) or in fp32 (a reference); the host's
embedding lookup reads the rows it needs. Every name is mapped explicitly and every
shape and value checked at load; transformers' `Conv1D` stores linear weights as
[in, out], which becomes the usual [out, in] here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import ModelLoadError
from orion.formats.safetensors import SafetensorsFolder
from orion.models.base import read_config_json

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu")
# Buffers older transformers versions saved with the weights: not parameters.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
LM_HEAD = "lm_head.weight"

# Bounds of the config's integers, checked before anything is sized from them (a
# `n_layer` of 1e9 used to build a billion-entry shape table first).
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 22), "n_positions": (1, 1 << 20), "n_embd": (1, 1 << 16),
    "n_layer": (1, 1024), "n_head": (1, 1 << 12), "n_inner": (1, 1 << 18),
    "bos_token_id": (0, 1 << 22), "eos_token_id": (0, 1 << 22),
}


@dataclass(frozen=True)
class GPT2Config:
    """Hyper-parameters of a GPT-2 model (names as in transformers' GPT2Config)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None           # None: 4 * n_embd
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256

    @property
    def d_ff(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> GPT2Config:
        if raw.get("model_type", "gpt2") != "gpt2":
            raise ModelLoadError(f"{source}: model_type {raw.get('model_type')!r} is not gpt2")
        unsupported = {
            "scale_attn_by_inverse_layer_idx": False,
            "add_cross_attention": False,
            "scale_attn_weights": True,
        }
        for key, wanted in unsupported.items():
            if bool(raw.get(key, wanted)) != wanted:
                raise ModelLoadError(f"{source}: {key}={raw[key]!r} is not supported")
        names = {f for f in cls.__dataclass_fields__}
        known = {k: v for k, v in raw.items() if k in names}
        _check_fields(known, source)
        config = cls(**known)
        if config.activation_function not in GELU_TANH:
            raise ModelLoadError(f"{source}: activation {config.activation_function!r} is not "
                                 f"supported (one of {', '.join(GELU_TANH)})")
        if config.n_embd % config.n_head:
            raise ModelLoadError(f"{source}: n_embd {config.n_embd} is not a multiple of "
                                 f"n_head {config.n_head}")
        return config

    @classmethod
    def from_folder(cls, folder: Path) -> GPT2Config:
        return cls.from_dict(read_config_json(folder), str(folder / "config.json"))


def _check_fields(raw: dict[str, Any], source: str) -> None:
    """Types and bounds of the config fields present (null is allowed where the
    dataclass default is None: n_inner, bos/eos ids)."""
    nullable = {f.name for f in fields(GPT2Config) if f.default is None}
    for name, (low, high) in INT_BOUNDS.items():
        if name not in raw or (raw[name] is None and name in nullable):
            continue
        v = raw[name]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelLoadError(f"{source}: {name} must be an integer, got {v!r}"[:200])
        if not low <= v <= high:
            raise ModelLoadError(f"{source}: {name} {v} is outside [{low}, {high}]")
    if "layer_norm_epsilon" in raw:
        v = raw["layer_norm_epsilon"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or not 0 < v < 1:
            raise ModelLoadError(f"{source}: layer_norm_epsilon must be a number in (0, 1), "
                                 f"got {v!r}"[:200])
    for name in ("activation_function",):
        if name in raw and not isinstance(raw[name], str):
            raise ModelLoadError(f"{source}: {name} must be a string")
    if "tie_word_embeddings" in raw and not isinstance(raw["tie_word_embeddings"], bool):
        raise ModelLoadError(f"{source}: tie_word_embeddings must be true or false")


@dataclass
class GPT2Layer:
    """One transformer block, linear weights [out, in] (fp16 for the device, fp32 for
    a reference), norms and biases fp32."""

    ln1_g: np.ndarray    # (n_embd,)
    ln1_b: np.ndarray    # (n_embd,)
    w_qkv: np.ndarray    # (3 n_embd, n_embd): q, k, v stacked
    b_qkv: np.ndarray    # (3 n_embd,)
    w_proj: np.ndarray   # (n_embd, n_embd)
    b_proj: np.ndarray   # (n_embd,)
    ln2_g: np.ndarray    # (n_embd,)
    ln2_b: np.ndarray    # (n_embd,)
    w_fc: np.ndarray     # (d_ff, n_embd)
    b_fc: np.ndarray     # (d_ff,)
    w_out: np.ndarray    # (n_embd, d_ff)
    b_out: np.ndarray    # (n_embd,)


class GPT2Weights:
    """The tensors of a checked GPT-2 folder, memory-mapped: each read converts what it
    returns and keeps nothing, so the model's life holds no host copy of its weights.
    Every read unmaps the files after it: the pages it touched leave the RSS (an LM
    head read row chunk by row chunk would otherwise leave all of the fp32 table's
    pages resident, twice its fp16 bytes)."""

    def __init__(self, config: GPT2Config, st: SafetensorsFolder, names: dict[str, str]
                 ) -> None:
        self.config, self.st = config, st
        self._names = names   # name in expected_shapes (or LM_HEAD) -> name in the file
        self.head_name = LM_HEAD if LM_HEAD in names else "wte.weight"

    def _read(self, key: str, dtype: type[np.floating], rows: np.ndarray | slice | None = None
              ) -> np.ndarray:
        name = self._names[key]
        try:   # a new array either way: nothing refers to the mapping after this
            return self.st.fp16(name, rows) if dtype is np.float16 else self.st.fp32(name, rows)
        finally:
            self.st.close()

    def layer(self, i: int, dtype: type[np.floating] = np.float16) -> GPT2Layer:
        """Block `i`, its linear weights in `dtype`."""
        p = f"h.{i}."

        def vec(name: str) -> np.ndarray:
            return self._read(p + name, np.float32)

        def linear(name: str) -> np.ndarray:  # Conv1D [in, out] -> [out, in]
            w = np.ascontiguousarray(self._read(p + name, dtype).T)
            w.setflags(write=False)   # frozen: a graph takes it without a copy
            return w

        return GPT2Layer(
            ln1_g=vec("ln_1.weight"), ln1_b=vec("ln_1.bias"),
            w_qkv=linear("attn.c_attn.weight"), b_qkv=vec("attn.c_attn.bias"),
            w_proj=linear("attn.c_proj.weight"), b_proj=vec("attn.c_proj.bias"),
            ln2_g=vec("ln_2.weight"), ln2_b=vec("ln_2.bias"),
            w_fc=linear("mlp.c_fc.weight"), b_fc=vec("mlp.c_fc.bias"),
            w_out=linear("mlp.c_proj.weight"), b_out=vec("mlp.c_proj.bias"),
        )

    def embed(self, ids: np.ndarray, start: int) -> np.ndarray:
        """fp32 [len(ids), n_embd]: token plus position embeddings from `start`; only
        the rows asked for are read."""
        ids = np.asarray(ids, dtype=np.int64)
        # every decode step looks rows up: read, not mapped (mapping and unmapping the
        # file twice a token cost ~200 us; a kept mapping, ~4 MiB of pages faulted around)
        return (self.st.read_rows_fp32(self._names["wte.weight"], ids)
                + self.st.read_rows_fp32(self._names["wpe.weight"],
                                         slice(start, start + ids.size)))

    def final_norm(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read("ln_f.weight", np.float32), self._read("ln_f.bias", np.float32)

    def head_rows(self, rows: slice, dtype: type[np.floating] = np.float16) -> np.ndarray:
        """Rows of the LM head [vocab, n_embd] (the token embedding when tied)."""
        return self._read(self.head_name, dtype, rows)

    def parameter_count(self) -> int:
        """From the headers: counting must not read the weights."""
        return sum(int(np.prod(self.st.shape(n))) for n in self._names.values())


def expected_shapes(c: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a transformers GPT2LMHeadModel checkpoint, by its name there
    (without the "transformer." prefix), in the file's own orientation."""
    d, f = c.n_embd, c.d_ff
    shapes: dict[str, tuple[int, ...]] = {
        "wte.weight": (c.vocab_size, d),
        "wpe.weight": (c.n_positions, d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    for i in range(c.n_layer):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, f), p + "mlp.c_fc.bias": (f,),
            p + "mlp.c_proj.weight": (f, d), p + "mlp.c_proj.bias": (d,),
        })
    return shapes


def _names_in_file(folder: Path, st: SafetensorsFolder) -> dict[str, str]:
    """GPT-2's tensor names (without the "transformer." prefix that GPT2LMHeadModel
    saves) -> the file's names, leaving out the attention buffers that older
    transformers versions saved with the weights."""
    names: dict[str, str] = {}
    for name in st:
        key = name.removeprefix("transformer.")
        if key.endswith(IGNORED_SUFFIXES):
            continue
        if key in names:
            raise ModelLoadError(f"{folder}: tensor {key} is stored twice, as {names[key]} "
                                 f"and as {name}")
        names[key] = name
    return names


def load_gpt2_weights(folder: Path, config: GPT2Config | None = None
                      ) -> tuple[GPT2Config, GPT2Weights]:
    """Config and weights of a Hugging Face GPT-2 folder, memory-mapped; every name,
    shape and value (finite, within fp16's range) is checked here, before any is used."""
    config = config or GPT2Config.from_folder(folder)
    st = SafetensorsFolder(folder)
    names = _names_in_file(folder, st)
    want = expected_shapes(config)
    if config.tie_word_embeddings:
        names.pop(LM_HEAD, None)   # as transformers: the head is the token embedding
    elif LM_HEAD in names:
        want[LM_HEAD] = want["wte.weight"]
    else:
        raise ModelLoadError(f"{folder}: missing tensor {LM_HEAD} (tie_word_embeddings is "
                             "false)")
    missing = sorted(set(want) - set(names))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{folder}: missing tensors {', '.join(missing[:5])}{more}")
    unexpected = sorted(set(names) - set(want))
    if unexpected:
        raise ModelLoadError(f"{folder}: tensors that GPT-2 with this config does not have: "
                             f"{', '.join(unexpected[:5])} (a different architecture, or "
                             "config.json does not match the weights)")
    for key, shape in want.items():
        got = st.shape(names[key])
        if got != shape:
            raise ModelLoadError(f"{st.tensors[names[key]].file}: tensor {key} has shape "
                                 f"{list(got)}, expected {list(shape)}")
    for key in want:
        st.check_range(names[key])
    return config, GPT2Weights(config, st, names)
