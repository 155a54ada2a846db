"""`orion convert`: what it writes mlx-lm loads and computes as Orion does, with the codes
mx.quantize gives; --dequantize writes the reference dequantization in fp16, which
transformers loads; bad options and occupied folders are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orion.cli import main
from orion.formats.safetensors import SafetensorsFolder
from orion.models import load_model
from orion.models.registry import load_hf_arrays, open_gguf_file, open_hf
from quant.gguf_writer import write_gguf

pytestmark = pytest.mark.native
PROMPT = [int(i) for i in np.random.default_rng(1).integers(0, 512, 16)]


@pytest.mark.slow
def test_mlx_lm_loads_what_orion_writes_and_computes_orions_logits(qwen3_hf, tmp_path):
    mx = pytest.importorskip("mlx.core")
    load = pytest.importorskip("mlx_lm").load
    out = tmp_path / "q4"
    assert main(["convert", "--model", str(qwen3_hf), "--out", str(out), "--bits", "4",
                 "--group-size", "64"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    # the codes are mx.quantize's of the same fp32 weights
    _, arrays = load_hf_arrays(qwen3_hf)
    st = SafetensorsFolder(out)
    name = "model.layers.1.mlp.down_proj"
    words, _, _ = mx.quantize(mx.array(arrays[f"{name}.weight"]), group_size=64, bits=4)
    np.testing.assert_array_equal(st.raw(f"{name}.weight"), np.array(words))
    st.close()
    model, _ = load(str(out))
    model.set_dtype(mx.float32)
    ref = np.array(model(mx.array([PROMPT]))[0].astype(mx.float32))
    with load_model(out, prefill_buckets=(32,), decode_buckets=(64,)) as m:
        ours = np.stack([m.prefill(PROMPT[:k + 1]) for k in (3, 9, 15)])
    worst = float(np.abs(ours - ref[[3, 9, 15]]).max())
    print(f"orion convert -> mlx-lm: max |orion - mlx-lm| {worst:.5f}, largest logit "
          f"{float(np.abs(ref).max()):.3f}")
    assert worst <= 16 * 2.0 ** -11 * float(np.abs(ref).max()), worst


def test_dequantize_an_mlx_folder_to_fp16(qwen3_mlx4, tmp_path):
    out = tmp_path / "fp16"
    assert main(["convert", "--model", str(qwen3_mlx4), "--out", str(out),
                 "--dequantize"]) == 0
    arch, weights = open_hf(qwen3_mlx4)
    fp16 = SafetensorsFolder(out)
    try:
        assert "quantization" not in json.loads((out / "config.json").read_text())
        for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                     "model.norm.weight"):
            assert fp16.tensors[name].dtype == "F16"
            np.testing.assert_array_equal(fp16.raw(name), weights.fp16(name))
    finally:
        weights.close()
        fp16.close()
    assert (out / "tokenizer.json").is_file()


def test_dequantize_a_gguf_file_with_its_tokenizer(qwen3_hf, tmp_path):
    from asset_paths import require_asset

    from quant.gguf_writer import vocab_metadata

    folder = require_asset("tokenizers/qwen2")
    meta = vocab_metadata(folder / "tokenizer.json", "qwen2",
                          (folder / "chat_template.jinja").read_text(), eos="<|endoftext|>")
    keep = 512
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"][:keep]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"][:keep]
    kept = set(meta["tokenizer.ggml.tokens"])
    meta["tokenizer.ggml.merges"] = [m for m in meta["tokenizer.ggml.merges"][:3000]
                                     if all(p in kept for p in [*m.split(" "),
                                                                m.replace(" ", "")])]
    meta["tokenizer.ggml.eos_token_id"] = 2
    meta.pop("tokenizer.chat_template")
    path = write_gguf(qwen3_hf, tmp_path / "m.gguf", "Q4_K", vocab=meta)
    out = tmp_path / "fp16"
    assert main(["convert", "-m", str(path), "--out", str(out), "--dequantize"]) == 0
    _, weights, tok = open_gguf_file(path)
    back = SafetensorsFolder(out)
    try:
        name = "model.layers.1.mlp.up_proj.weight"
        np.testing.assert_array_equal(back.raw(name), weights.fp16(name))
    finally:
        weights.close()
        back.close()
    with load_model(out) as m:
        assert m.tokenizer.encode("Hello there") == tok.encode("Hello there")


def test_refusals_are_one_line(qwen3_hf, tmp_path, capsys):
    assert main(["convert", "-m", str(qwen3_hf), "--out", str(tmp_path / "a"),
                 "--bits", "7"]) == 2
    assert "--bits must be one of" in capsys.readouterr().err
    assert main(["convert", "-m", str(qwen3_hf), "--out", str(qwen3_hf)]) == 2
    assert "must not be the source's" in capsys.readouterr().err
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "config.json").write_text("{}")
    assert main(["convert", "-m", str(qwen3_hf), "--out", str(occupied)]) == 2
    assert "holds a model" in capsys.readouterr().err
