"""`orion convert --palettize`: each table is a k-means fixed point of its channels'
normalized weights; the stored tables decode as coremltools' `constexpr_lut_to_dense`
reference decodes them; the palettized model computes what transformers (fp32)
computes on those decoded weights, on GPT-2 (whose files store [in, out]) and on a
Qwen3 shape; LoRA trains over the palettized base; malformed folders and options are
refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from models.conftest import save_peaked_gpt2
from models.hf_fixtures import hf_reference, save_numpy_init

from orion.cli import main
from orion.errors import InvalidArgumentError, ModelLoadError
from orion.formats import palettize as PL
from orion.formats.safetensors import SafetensorsFolder, save_mixed
from orion.ir.quant import unpack_codes
from orion.models import load_model
from orion.models.registry import load_hf_arrays, open_hf
from orion.models.weights import save_folder
from quant.conftest import small

pytestmark = pytest.mark.native
ULPS = 8 * 2.0 ** -11          # as the fp16 tests: 8 fp16 ulps of the largest logit
PROMPT = [int(i) for i in np.random.default_rng(1).integers(0, 512, 16)]


def _gaussian(rows: int = 64, cols: int = 256) -> np.ndarray:
    return (0.02 * np.random.default_rng(0).standard_normal((rows, cols))).astype(np.float32)


@pytest.mark.parametrize("bits", (2, 3, 4, 6))   # 8: clusters of a few values in fp16
def test_each_table_is_a_kmeans_fixed_point(bits):
    w = _gaussian()
    spec = PL.PaletteSpec(bits, 16)
    codes, lut, scale = PL.palettize(w, spec)
    assert codes.shape == (64, 256 * bits // 8) and lut.shape == (4, 1 << bits)
    assert scale.dtype == np.float16 and np.all(np.abs(w) <= scale[:, None].astype(np.float32))
    q = unpack_codes(codes.reshape(-1), bits, w.size, False).reshape(w.shape).astype(np.int64)
    u = w / scale.astype(np.float32)[:, None]
    table = lut.astype(np.float32)[np.arange(64) // 16]                 # [rows, 2^bits]
    dist = np.abs(u[:, :, None] - table[:, None, :])
    chosen = np.take_along_axis(dist, q[:, :, None], axis=2)[..., 0]
    assert np.all(chosen <= dist.min(axis=2))           # every code its nearest entry
    # every used entry its values' mean (Lloyd's fixed point), to within fp16's rounding
    # of the entries (an ulp of 1) and the values that rounding moves to a neighbour
    # (5% of the gap to it)
    for grp in range(4):
        uu, qq = u[grp * 16:(grp + 1) * 16].ravel(), q[grp * 16:(grp + 1) * 16].ravel()
        entries = lut[grp].astype(np.float64)
        for k in np.unique(qq):
            gap = min(np.diff(entries[max(k - 1, 0): k + 2]))
            assert abs(entries[k] - uu[qq == k].mean()) <= 2.0 ** -11 + 0.05 * gap, (grp, k)


@pytest.mark.parametrize("bits, ratio", [(2, 0.9), (3, 0.9), (4, 0.9), (6, 1.0), (8, 1.0)])
def test_error_below_a_uniform_grid_of_the_same_bits(bits, ratio):
    """Lloyd from the quantiles beats evenly spaced levels over each row's range (relative
    RMS error here 0.35 / 0.64 at 2 bits, 0.19 / 0.27 at 3, 0.096 / 0.126 at 4); from
    evenly spaced entries (6 and 8 bits) it can only improve on them, short of fp16
    rounding (0.029 / 0.030, 0.007 / 0.007)."""
    w = _gaussian(128, 512)
    spec = PL.PaletteSpec(bits, 16)
    codes, lut, scale = PL.palettize(w, spec)
    ours = PL.dense_fp16(codes, lut, scale, bits, 16).astype(np.float32)
    k = (1 << bits) - 1
    peak = np.abs(w).max(axis=1, keepdims=True)
    uniform = (np.round((w / peak + 1) / 2 * k) / k * 2 - 1) * peak
    assert np.sqrt(np.mean((ours - w) ** 2)) < ratio * np.sqrt(np.mean((uniform - w) ** 2))


def _ios18_lut(codes: np.ndarray, lut: np.ndarray, bits: int, shape: tuple[int, int],
               group: int) -> np.ndarray:
    from coremltools.converters.mil.mil.ops.defs.iOS18 import compression

    idx = unpack_codes(codes.reshape(-1), bits, shape[0] * shape[1], False)
    table = lut.reshape(shape[0] // group, 1, 1 << bits, 1)
    return compression.constexpr_lut_to_dense.decompress(
        idx.reshape(shape).astype(np.uint8), table, None)


def _reference_folder(pal, out):
    """An fp32 Hugging Face folder of the weights the palettized folder stands for:
    each table decoded by coremltools' reference, times its channel scale (fp32)."""
    pytest.importorskip("coremltools", reason="coremltools' decompress is the reference")
    arch, weights = open_hf(pal)
    spec = weights.spec
    st = SafetensorsFolder(pal)
    arrays = {}
    try:
        for name in arch.parameters():
            m = weights.palettized.get(name)
            if m is None:
                arrays[name] = weights.fp32(name)
                continue
            dense = _ios18_lut(np.asarray(st.raw(m.codes)), np.asarray(st.raw(m.lut)),
                               spec.bits, m.shape, m.group)
            arrays[name] = dense.astype(np.float32) * st.fp32(m.scale)[:, None]
    finally:
        weights.close()
        st.close()
    save_folder(out, arch, arrays, "float32")
    return out, arch


def _check_against_transformers(pal, tmp_path):
    import torch

    ref_dir, arch = _reference_folder(pal, tmp_path / "reference")
    model = hf_reference(ref_dir)
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT])).logits[0].numpy()
    with load_model(pal, prefill_buckets=(32,), decode_buckets=(64,)) as m:
        ours = np.stack([m.prefill(PROMPT[:k + 1]) for k in (3, 9, 15)])
    worst = float(np.abs(ours - ref[[3, 9, 15]]).max())
    tol = ULPS * float(np.abs(ref).max())
    print(f"{arch.model_type} palettized: max |orion - transformers| {worst:.5f} "
          f"(bound {tol:.5f})")
    assert worst <= tol


@pytest.fixture(scope="module")
def qwen3_pal(tmp_path_factory):
    root = tmp_path_factory.mktemp("palettize")
    hf = save_numpy_init(root / "hf", small("Qwen3-0.6B"))
    out = root / "pal4"
    assert main(["convert", "--model", str(hf), "--out", str(out), "--palettize"]) == 0
    return hf, out


def test_qwen3_palettized_equals_transformers_on_the_decoded_weights(qwen3_pal, tmp_path):
    hf, pal = qwen3_pal
    cfg = json.loads((pal / "config.json").read_text())
    assert cfg["palettization"] == {"bits": 4, "group_channels": 16}
    st = SafetensorsFolder(pal)
    try:
        name = "model.layers.0.mlp.down_proj"
        assert st.tensors[f"{name}.weight"].dtype == "U8"
        assert st.tensors[f"{name}.lut"].shape == (256 // 16, 16)
        assert st.tensors["model.embed_tokens.weight"].dtype == "U8"
        assert st.tensors["model.embed_tokens.lut"].shape == (512 // 16, 16)
        assert st.tensors["model.norm.weight"].dtype == "F16"
    finally:
        st.close()
    _check_against_transformers(pal, tmp_path)


def test_gpt2_palettized_equals_transformers_on_the_decoded_weights(tmp_path):
    """GPT-2's files store [in, out]; an untied classifier of 516 rows gets tables of 4
    channels (8 do not divide it)."""
    hf = save_peaked_gpt2(tmp_path / "hf", {"n_layer": 2, "n_embd": 256, "n_head": 4,
                                            "n_positions": 256, "vocab_size": 516})
    pal = tmp_path / "pal"
    assert main(["convert", "--model", str(hf), "--out", str(pal), "--palettize", "--bits",
                 "6", "--group-channels", "8"]) == 0
    st = SafetensorsFolder(pal)
    try:
        assert st.tensors["lm_head.lut"].shape == (516 // 4, 64)
        assert st.tensors["transformer.h.0.attn.c_attn.lut"].shape == (768 // 8, 64)
    finally:
        st.close()
    _check_against_transformers(pal, tmp_path)


def test_the_host_value_is_the_table_times_the_scale(qwen3_pal):
    _, pal = qwen3_pal
    arch, weights = open_hf(pal)
    try:
        name = "model.layers.1.self_attn.o_proj.weight"
        q = weights.quant(name)
        assert q is not None and q.post_scale is not None and q.op == "lut"
        full = weights.fp16(name)
        np.testing.assert_array_equal(full, q.dense())
        np.testing.assert_array_equal(weights.fp16(name, slice(16, 48)), full[16:48])
        with pytest.raises(InvalidArgumentError, match="post_scale"):
            q.transposed()
    finally:
        weights.close()


def test_a_run_of_whole_tables_is_built_alone(qwen3_pal):
    from orion.models.frozen import frozen_base

    _, pal = qwen3_pal
    arch, weights = open_hf(pal)
    try:
        whole = weights.quant(arch.embed_name)            # 512 rows, tables of 16
        part = weights.quant(arch.embed_name, slice(64, 160))
        np.testing.assert_array_equal(part.dense(), whole.dense()[64:160])
        np.testing.assert_array_equal(part.post_scale, whole.post_scale[64:160])
        with pytest.raises(InvalidArgumentError, match="cut its tables"):
            weights.quant(arch.embed_name, slice(8, 64))
    finally:
        weights.close()
    _, frozen, _ = frozen_base(pal)                        # QLoRA's frozen base
    name = "model.layers.0.mlp.up_proj.weight"
    np.testing.assert_array_equal(frozen.quant(name, slice(16, 48)).dense(),
                                  frozen.quant(name).dense()[16:48])


def test_dequantize_writes_the_host_values(qwen3_pal, tmp_path):
    _, pal = qwen3_pal
    out = tmp_path / "fp16"
    assert main(["convert", "--model", str(pal), "--out", str(out), "--dequantize"]) == 0
    _, dense = load_hf_arrays(out)
    arch, weights = open_hf(pal)
    try:
        for name in ("model.layers.0.mlp.gate_proj.weight", "model.norm.weight"):
            np.testing.assert_array_equal(dense[name], weights.fp32(name))
    finally:
        weights.close()


def test_lora_trains_over_a_palettized_base(qwen3_pal):
    from quant.test_qlora import steps_on_compressed_and_dense

    _, pal = qwen3_pal
    outs = steps_on_compressed_and_dense(pal, ("q_proj", "down_proj"), 512)
    # the scale multiplies the conv's output rather than each weight: one rounding apart
    assert abs(outs[0].loss - outs[1].loss) <= 1e-3 * abs(outs[1].loss)
    for name in outs[0].grads:
        a, b = outs[0].grads[name], outs[1].grads[name]
        assert np.abs(a - b).max() <= 0.02 * np.abs(b).max() + 1e-6, name


# ---- refusals -------------------------------------------------------------------------


def _broken(pal, tmp_path, edit) -> object:
    out = tmp_path / "broken"
    shutil.copytree(pal, out)
    st = SafetensorsFolder(out)
    tensors = {n: (np.array(st.raw(n)), {"U8": "uint8", "F16": "float16", "F32": "float32"}[
        st.tensors[n].dtype]) for n in st}
    st.close()
    cfg = json.loads((out / "config.json").read_text())
    edit(tensors, cfg)
    (out / "model.safetensors").write_bytes(save_mixed(tensors))
    (out / "config.json").write_text(json.dumps(cfg))
    return out


LUT = "model.layers.0.mlp.up_proj.lut"
SCALE = "model.layers.0.mlp.up_proj.channel_scale"


@pytest.mark.parametrize("edit, message", [
    (lambda t, c: t.__setitem__(LUT, (t[LUT][0][:, :8], "float16")), "needs F16"),
    (lambda t, c: t.pop(SCALE), "no channel_scale"),
    (lambda t, c: (t.__setitem__(SCALE, (np.full(t[SCALE][0].shape, 60000, np.float16),
                                         "float16")),
                   t.__setitem__(LUT, (np.full(t[LUT][0].shape, 2, np.float16), "float16"))),
     "outside fp16's range"),
    (lambda t, c: c.pop("palettization"), "no \"palettization\""),
    (lambda t, c: c.__setitem__("palettization", {"bits": 5, "group_channels": 16}),
     "bits 5 is not one of"),
    (lambda t, c: c.__setitem__("palettization", {"bits": 4, "group_channels": 16,
                                                  "vector": 2}), "bits and group_channels"),
    (lambda t, c: c.__setitem__("quantization", {"bits": 4, "group_size": 64}),
     "one or the other"),
    (lambda t, c: t.__setitem__(LUT, (t[LUT][0][:5], "float16")), "5 tables for 768"),
    (lambda t, c: t.__setitem__("model.norm.lut", t[LUT]), "only the layers' linear"),
    (lambda t, c: t.__setitem__("model.layers.0.mlp.stray.lut", t[LUT]), "belongs to no"),
])
def test_malformed_palettized_folders_are_refused(qwen3_pal, tmp_path, edit, message):
    _, pal = qwen3_pal
    bad = _broken(pal, tmp_path, edit)
    with pytest.raises(ModelLoadError, match=message):
        _, w = open_hf(bad)
        w.close()


@pytest.mark.parametrize("args, message", [
    (["--palettize", "--bits", "5"], "bits 5 is not one of"),
    (["--palettize", "--group-channels", "3"], "group_channels 3"),
    (["--palettize", "--dequantize"], "cannot go together"),
])
def test_bad_options_are_refused_in_one_line(qwen3_pal, tmp_path, capsys, args, message):
    hf, _ = qwen3_pal
    assert main(["convert", "--model", str(hf), "--out", str(tmp_path / "o"), *args]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_compressed_source_is_refused(qwen3_pal, tmp_path, capsys):
    _, pal = qwen3_pal
    assert main(["convert", "--model", str(pal), "--out", str(tmp_path / "o"),
                 "--palettize"]) != 0
    assert "already compressed" in capsys.readouterr().err


def test_a_gguf_source_is_refused_by_name(tmp_path, capsys):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    for extra in (["--palettize"], ["--bits", "4"]):
        assert main(["convert", "--model", str(gguf), "--out", str(tmp_path / "o"),
                     *extra]) != 0
        err = capsys.readouterr().err
        assert "compressed already" in err and "Traceback" not in err
