"""MLX quantized folders (mlx_lm.convert's output) load: every weight Orion reads is
mlx's own dequantization bit for bit (in fp16), per-module overrides are honoured, and
malformed folders are refused naming what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from orion.errors import ModelLoadError
from orion.models.registry import open_hf

mx = pytest.importorskip("mlx.core")


def _mlx_dequantized(folder, module, spec):
    arrays = {}
    for path in sorted(folder.glob("*.safetensors")):
        arrays.update(mx.load(str(path)))
    w, s, b = (arrays[f"{module}.{k}"] for k in ("weight", "scales", "biases"))
    out = mx.dequantize(w, s, b, group_size=spec.group_size, bits=spec.bits)
    return np.array(out.astype(mx.float32)).astype(np.float16)


def test_every_weight_is_mlx_dequantize(qwen3_mlx4):
    arch, weights = open_hf(qwen3_mlx4)
    try:
        quantized = [n for n in weights.names() if weights.module(n) is not None]
        assert "model.embed_tokens.weight" in quantized
        assert len(quantized) == 1 + 7 * arch.args.n_layers
        for name in quantized:
            q = weights.module(name)
            ref = _mlx_dequantized(qwen3_mlx4, name[: -len(".weight")], q.spec)
            np.testing.assert_array_equal(weights.fp16(name).view(np.uint16),
                                          ref.view(np.uint16), err_msg=name)
        rows = np.array([5, 0, 511, 5])
        np.testing.assert_array_equal(weights.rows_fp32("model.embed_tokens.weight", rows),
                                      ref_rows := weights.fp16("model.embed_tokens.weight")
                                      [rows].astype(np.float32))
        assert ref_rows.shape == (4, arch.args.dim)
    finally:
        weights.close()


def test_a_run_of_rows_is_built_alone_as_the_whole_cuts_it(qwen3_mlx4):
    arch, weights = open_hf(qwen3_mlx4)
    try:
        for name in (arch.embed_name, "model.layers.0.mlp.down_proj.weight"):
            whole = weights.quant(name)
            rows = whole.shape[0]
            part = weights.quant(name, slice(rows // 4, rows // 2))
            np.testing.assert_array_equal(part.dense(), whole.dense()[rows // 4: rows // 2])
    finally:
        weights.close()


def test_the_load_checks_leave_no_mapping(qwen3_mlx4):
    """Opening the folder reads every scale and bias to check them; the mapping that
    read them is dropped before the weights are handed over (kept, it held 36 MiB of the
    Qwen3-0.6B shape's 4-bit file resident beside the programs' own copies)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps (Linux): CI runs it")
    files = sorted(str(p.resolve()) for p in qwen3_mlx4.glob("*.safetensors"))
    arch, weights = open_hf(qwen3_mlx4)
    try:
        assert not [f for f in files if f in maps.read_text()]
        weights.rows_fp32(arch.embed_name, np.array([3, 1]))   # a decode step's lookup
        assert not [f for f in files if f in maps.read_text()]
    finally:
        weights.close()


def _rewrite_config(folder, update):
    """config.json with `update` (None: removed); quantization_config mirrors a new
    quantization, as mlx-lm writes them, unless the update names it."""
    cfg = json.loads((folder / "config.json").read_text())
    if "quantization" in update and "quantization_config" not in update:
        update = {**update, "quantization_config": update["quantization"]}
    for k, v in update.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def test_per_module_overrides(qwen3_hf, tmp_path):
    """mlx-lm's mixed recipes: one module at other bits and group size, one left in
    floats (config.json names both)."""
    from orion.formats.mlx_quant import QuantSpec
    from quant.conftest import mlx_convert

    def predicate(path, module):
        if path.endswith("embed_tokens"):
            return {"group_size": 32, "bits": 8}
        return not path.endswith("layers.1.mlp.down_proj")

    pytest.importorskip("mlx_lm")
    from mlx_lm import convert

    out = tmp_path / "mixed"
    convert(str(qwen3_hf), mlx_path=str(out), quantize=True, q_bits=3, q_group_size=128,
            quant_predicate=predicate)
    assert mlx_convert  # the plain recipe is the session fixture's
    arch, weights = open_hf(out)
    try:
        assert weights.module("model.embed_tokens.weight").spec == QuantSpec(8, 32)
        assert weights.module("model.layers.0.mlp.up_proj.weight").spec == QuantSpec(3, 128)
        assert weights.module("model.layers.1.mlp.down_proj.weight") is None
        ref = _mlx_dequantized(out, "model.embed_tokens", QuantSpec(8, 32))
        np.testing.assert_array_equal(weights.fp16("model.embed_tokens.weight"), ref)
    finally:
        weights.close()


@pytest.mark.parametrize("update,match", [
    ({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}, "mxfp4"),
    ({"quantization": {"group_size": 64, "bits": 7}}, "bits 7"),
    ({"quantization": {"group_size": 64, "bits": 8}}, "need U32"),
    ({"quantization": {"group_size": 32, "bits": 4}}, "need"),
    ({"quantization": None, "quantization_config": None}, "no \"quantization\""),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
])
def test_malformed_folders_are_refused(qwen3_mlx4, tmp_path, update, match):
    folder = tmp_path / "m"
    shutil.copytree(qwen3_mlx4, folder)
    _rewrite_config(folder, update)
    with pytest.raises(ModelLoadError, match=match):
        open_hf(folder)[1].close()


def test_missing_biases_and_out_of_range_scales(qwen3_mlx4, tmp_path):
    pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    for case in ("no_biases", "huge_scale"):
        folder = tmp_path / case
        shutil.copytree(qwen3_mlx4, folder)
        tensors = {}
        for path in folder.glob("*.safetensors"):
            tensors.update(load_file(str(path)))
            path.unlink()
        (folder / "model.safetensors.index.json").unlink(missing_ok=True)
        name = "model.layers.0.mlp.up_proj"
        if case == "no_biases":
            del tensors[f"{name}.biases"]
            match = "no biases"
        else:
            s = tensors[f"{name}.scales"].clone()
            s[0, 0] = 10000.0   # within fp16, but 15 of it is not
            tensors[f"{name}.scales"] = s
            match = "outside fp16's range"
        save_file(tensors, str(folder / "model.safetensors"))
        with pytest.raises(ModelLoadError, match=match):
            open_hf(folder)


def test_generate_from_an_mlx_folder(qwen3_mlx4, capsys):
    from orion.cli import main

    assert main(["generate", "--model", str(qwen3_mlx4), "hi", "--max-tokens", "4"]) == 0
    assert capsys.readouterr().out
