"""llama2.c checkpoints and Hugging Face folders, both directions."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from models.llama_args import llama
from models.llama_reference import rope, rope_tables

from orion.errors import ModelLoadError
from orion.formats.llama2c import (
    MAGIC,
    half_to_interleaved,
    interleaved_to_half,
    read_llama2c,
    write_llama2c,
)
from orion.models.registry import architecture_from_config, load_hf_arrays
from orion.models.weights import init_weights, save_folder

FIELDS = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=50, hidden_dim=40,
              max_seq_len=16)
ARCH = llama(**FIELDS)
CFG = ARCH.args


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("tied", [True, False])
def test_llama2c_round_trip(tmp_path, version, tied):
    arch = llama(**FIELDS, tie_embeddings=tied)
    w = init_weights(arch, 1)
    write_llama2c(tmp_path / "m.bin", arch.to_config(), w, version=version)
    config, w2 = read_llama2c(tmp_path / "m.bin")
    assert architecture_from_config(config, "c") == arch
    _same(w, w2)


def _rope_interleaved(x, theta=10000.0):
    """llama2.c's RoPE: rotate (x[2i], x[2i+1]) pairs; x [S, H, hd]."""
    s, _, hd = x.shape
    freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.outer(np.arange(s), freq)[:, None, :]
    re, im = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = re * np.cos(ang) - im * np.sin(ang)
    out[..., 1::2] = re * np.sin(ang) + im * np.cos(ang)
    return out


def test_permutation_matches_llama2c_rope():
    """Attention scores of llama2.c's layout (interleaved RoPE) equal ours (rotate-half)."""
    rng = np.random.default_rng(0)
    s, h, hd, d = 8, 4, 8, 32
    x = rng.standard_normal((s, d))
    wq_meta, wk_meta = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    q_m = _rope_interleaved((x @ wq_meta.T).reshape(s, h, hd))
    k_m = _rope_interleaved((x @ wk_meta.T).reshape(s, h, hd))
    cos, sin = rope_tables(s, hd, 10000.0, np.float64)
    q_h = rope((x @ interleaved_to_half(wq_meta, h).T).reshape(1, s, h, hd), cos, sin)[0]
    k_h = rope((x @ interleaved_to_half(wk_meta, h).T).reshape(1, s, h, hd), cos, sin)[0]
    np.testing.assert_allclose(np.einsum("shd,thd->hst", q_m, k_m),
                               np.einsum("shd,thd->hst", q_h, k_h), rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(half_to_interleaved(interleaved_to_half(wq_meta, h), h),
                                  wq_meta)


def test_llama2c_version2_q80(tmp_path):
    """Version 2 (Q8_0): per tensor, int8 values then one fp32 scale per group; read back
    dequantized. The file is built here as llama2.c's version2_export writes it."""
    cfg, w = CFG, init_weights(ARCH, 2)
    write_llama2c(tmp_path / "v1.bin", ARCH.to_config(), w, version=1)
    body = np.frombuffer((tmp_path / "v1.bin").read_bytes()[256:], np.float32)
    group = 16
    head = struct.pack("<Ii7iBi", MAGIC, 2, cfg.dim, cfg.hidden_dim, cfg.n_layers,
                       cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.max_positions, 1, group)
    n_norm = (2 * cfg.n_layers + 1) * cfg.dim
    parts = [head + b"\0" * (256 - len(head)), body[:n_norm].tobytes()]
    sizes = [cfg.vocab_size * cfg.dim]
    for n in (cfg.dim * cfg.dim, cfg.kv_dim * cfg.dim, cfg.kv_dim * cfg.dim, cfg.dim * cfg.dim,
              cfg.hidden_dim * cfg.dim, cfg.dim * cfg.hidden_dim, cfg.hidden_dim * cfg.dim):
        sizes += [n] * cfg.n_layers
    pos, deq = n_norm, [body[:n_norm]]
    for n in sizes:
        t = body[pos:pos + n].reshape(-1, group)
        pos += n
        scale = (np.abs(t).max(axis=1) / 127.0).astype(np.float32)
        q = np.round(t / scale[:, None]).astype(np.int8)
        parts += [q.tobytes(), scale.tobytes()]
        deq.append((q.astype(np.float32) * scale[:, None]).reshape(-1))
    assert pos == body.size
    (tmp_path / "v2.bin").write_bytes(b"".join(parts))
    (tmp_path / "deq.bin").write_bytes((tmp_path / "v1.bin").read_bytes()[:256]
                                       + np.concatenate(deq).astype(np.float32).tobytes())
    config, w2 = read_llama2c(tmp_path / "v2.bin")
    _, expect = read_llama2c(tmp_path / "deq.bin")
    assert architecture_from_config(config, "c") == ARCH
    for k in expect:
        np.testing.assert_allclose(w2[k], expect[k], rtol=1e-6, atol=1e-7, err_msg=k)
        assert np.abs(w2[k] - w[k]).max() <= np.abs(w[k]).max() / 127 + 1e-6


def test_truncated_file_is_refused(tmp_path):
    write_llama2c(tmp_path / "m.bin", ARCH.to_config(), init_weights(ARCH, 0), version=1)
    data = (tmp_path / "m.bin").read_bytes()
    (tmp_path / "t.bin").write_bytes(data[:-10])
    with pytest.raises(ModelLoadError, match="truncated"):
        read_llama2c(tmp_path / "t.bin")


def test_hf_folder_round_trip_and_transformers_reads_it(tmp_path):
    w = init_weights(ARCH, 3)
    save_folder(tmp_path, ARCH, w)
    arch2, w2 = load_hf_arrays(tmp_path)
    assert arch2 == ARCH
    _same(w, w2)
    transformers = pytest.importorskip("transformers", reason="HF is the reference reader")
    pytest.importorskip("torch", reason="transformers needs torch")
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    np.testing.assert_array_equal(
        model.model.layers[1].self_attn.k_proj.weight.detach().numpy(),
        w["model.layers.1.self_attn.k_proj.weight"])
