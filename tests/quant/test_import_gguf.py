"""GGUF files load: written by gguf-py's writer as llama.cpp's converter lays them out,
an F16 file runs exactly as the Hugging Face folder it came from, every quantized
weight is gguf-py's dequantization (in fp16), the tokenizer and chat template come from
the metadata, and hostile files are refused naming what is wrong."""

from __future__ import annotations

import gc
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from asset_paths import require_asset

from orion.errors import ModelLoadError
from orion.formats.gguf import GGUFFile
from orion.models.registry import load_model, open_gguf_file
from quant.gguf_writer import permute, vocab_metadata, write_gguf

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.native
IDS = np.array([1, 5, 9, 200, 300, 7, 8, 9, 10, 11, 12, 13])
SMALL = {"prefill_buckets": (32,), "decode_buckets": (256,)}


def _logits(path):
    """The device's logits (fp16 throughout) after the prompt and after 3 decode steps."""
    model = load_model(path, **SMALL)
    try:
        out = [model.prefill(IDS)]
        for t in (4, 40, 400):
            out.append(model.decode(t))
        return np.stack(out).astype(np.float32)
    finally:
        model.close()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama_hf", "qwen3_hf"])
def test_f16_gguf_runs_as_its_folder(which, request, tmp_path):
    """Bit for bit: the names map back, Llama's permuted q/k rows are put back."""
    hf = request.getfixturevalue(which)
    path = write_gguf(hf, tmp_path / "m.gguf", "F16")
    np.testing.assert_array_equal(_logits(path), _logits(hf))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K", "Q6_K", "BF16"])
def test_every_weight_is_gguf_py_dequantize(llama_hf, tmp_path, qtype):
    path = write_gguf(llama_hf, tmp_path / "m.gguf", qtype, embed_type="Q6_K",
                      head_type="Q8_0")
    reader = gguf.GGUFReader(str(path))
    ref = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
           for t in reader.tensors}
    arch, weights, _ = open_gguf_file(path)
    a = arch.args
    try:
        for name in weights.names():
            t = weights.entry(name).tensor
            want = ref[t.name].reshape(t.shape)
            if ".attn_q." in t.name or ".attn_k." in t.name:   # the converter's order back
                heads = a.n_heads if ".attn_q." in t.name else a.n_kv_heads
                assert np.array_equal(np.argsort(permute(np.arange(t.shape[0]), heads)),
                                      weights.stored_rows(name))
                want = want[weights.stored_rows(name)]
            np.testing.assert_array_equal(weights.fp32(name), want, err_msg=name)
            np.testing.assert_array_equal(weights.fp16(name), want.astype(np.float16))
    finally:
        weights.close()


@pytest.mark.slow
def test_gpt2_gguf_as_the_benchmark_writes_it(tmp_path):
    """GPT-2 (tied classifier), written as benchmarks/gguf_gpt2.py writes it."""
    import importlib.util
    from pathlib import Path

    from models.hf_fixtures import save_hf_model

    tiny_gpt2_dir = save_hf_model(tmp_path / "hf", {
        "model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 256,
        "vocab_size": 512, "tie_word_embeddings": True, "layer_norm_epsilon": 1e-5},
        embed_scale=10.0)
    from orion.models.registry import load_hf_arrays
    from orion.models.weights import save_folder

    save_folder(tiny_gpt2_dir, *load_hf_arrays(tiny_gpt2_dir))   # fp32: the writer's numpy

    where = Path(__file__).resolve().parents[2] / "benchmarks" / "gguf_gpt2.py"
    spec = importlib.util.spec_from_file_location("gguf_gpt2", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = module.write_gpt2_gguf(tiny_gpt2_dir, tmp_path / "gpt2.gguf")
    np.testing.assert_array_equal(_logits(path), _logits(tiny_gpt2_dir))


@pytest.mark.slow
@pytest.mark.parametrize("name,pre", [("qwen2", "qwen2"), ("llama3", "llama-bpe")])
def test_tokenizer_and_template_from_metadata(name, pre, tmp_path, qwen3_hf):
    from orion.tokenizers import load_tokenizer
    from orion.tokenizers.gguf import gguf_tokenizer

    folder = require_asset(f"tokenizers/{name}")
    want = load_tokenizer(folder)
    template = (folder / "chat_template.jinja").read_text()
    meta = vocab_metadata(folder / "tokenizer.json", pre, template,
                          bos=want.special_tokens.get("bos_token"),
                          eos=want.special_tokens.get("eos_token"))
    tok = gguf_tokenizer(meta, "m.gguf")
    assert tok is not None and tok.vocab_size == want.vocab_size
    for text in ["Hello world", "  leading spaces\n\nand 12345 digits", "naïve café 東京",
                 "<|im_start|>user\nhi<|im_end|>", "don't  stop'll", "x" * 300]:
        assert tok.encode(text, add_special_tokens=False) == \
            want.encode(text, add_special_tokens=False), text
        ids = want.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == want.decode(ids)
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == want.apply_chat_template(messages)
    assert tok.eos_token_id == want.eos_token_id


def _vocab_of_512() -> dict:
    """Qwen2's vocabulary cut to the test model's 512 tokens, with the merges among them."""
    folder = require_asset("tokenizers/qwen2")
    meta = vocab_metadata(folder / "tokenizer.json", "qwen2", eos="<|endoftext|>")
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"][:512]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"][:512]
    kept = set(meta["tokenizer.ggml.tokens"])
    meta["tokenizer.ggml.merges"] = [m for m in meta["tokenizer.ggml.merges"][:2000]
                                     if all(p in kept for p in [*m.split(" "),
                                                                m.replace(" ", "")])]
    meta["tokenizer.ggml.eos_token_id"] = 2
    return meta


@pytest.mark.slow
def test_generate_from_a_gguf_file(qwen3_hf, tmp_path, capsys):
    from orion.cli import main

    path = write_gguf(qwen3_hf, tmp_path / "m.gguf", "Q4_0")
    assert main(["generate", "--model", str(path), "--max-tokens", "4", "hi"]) == 2
    assert "no tokenizer" in capsys.readouterr().err      # no vocabulary in this file
    path = write_gguf(qwen3_hf, tmp_path / "v.gguf", "Q4_0", vocab=_vocab_of_512())
    assert main(["generate", "--model", str(path), "--max-tokens", "4", "hi"]) == 0
    assert capsys.readouterr().out


# ---- hostile files ---------------------------------------------------------------


@pytest.fixture(scope="module")
def small_gguf(llama_hf, tmp_path_factory):
    return write_gguf(llama_hf, tmp_path_factory.mktemp("g") / "m.gguf", "Q4_0")


def test_a_run_of_rows_is_built_alone_as_the_whole_cuts_it(small_gguf):
    """A classifier chunk's compressed rows (quant with rows) equal those rows of the
    whole matrix, Llama's permuted q/k rows included."""
    arch, weights, _ = open_gguf_file(small_gguf)
    try:
        for name in weights.names():
            whole = weights.quant(name)
            if whole is None:
                continue
            rows = whole.shape[0]
            for lo, hi in ((0, rows), (rows // 4, rows // 2), (rows - 3, rows)):
                part = weights.quant(name, slice(lo, hi))
                assert part.shape == (hi - lo, whole.shape[1])
                np.testing.assert_array_equal(part.dense(), whole.dense()[lo:hi], name)
    finally:
        weights.close()


def _tensor_headers(path):
    """(offset of each tensor header's dims, of its type field, of its offset field)."""
    data = path.read_bytes()
    f = GGUFFile(path)
    out = {}
    for name in f.tensors:
        key = struct.pack("<Q", len(name)) + name.encode()
        at = data.index(key) + len(key)
        n = struct.unpack_from("<I", data, at)[0]
        out[name] = (at + 4, at + 4 + 8 * n, at + 4 + 8 * n + 4)
    return data, out


def test_every_truncation_is_an_error(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    f = GGUFFile(small_gguf)
    header_end = min(t.start for t in f.tensors.values())
    cuts = sorted({*range(0, 64), *range(64, header_end, 997), header_end,
                   header_end + 1, len(data) - 1})
    bad = tmp_path / "cut.gguf"
    for n in cuts:
        bad.write_bytes(data[:n])
        with pytest.raises(ModelLoadError):
            GGUFFile(bad)


@pytest.mark.parametrize("case,match", [
    ("magic", "not a GGUF file"), ("version", "version 7"), ("count", "claims"),
    ("dims", "dimensions"), ("type", "Q5_K is not supported"), ("offset", "past the end"),
    ("misaligned", "alignment"), ("overlap", "overlap"), ("name", "unexpected"),
    ("duplicate", "given twice"), ("nan", "not finite"), ("shape", "shape"),
])
def test_hostile_headers(small_gguf, tmp_path, case, match):
    data, heads = _tensor_headers(small_gguf)
    data = bytearray(data)
    f = GGUFFile(small_gguf)
    first, second = "blk.0.attn_q.weight", "blk.0.attn_k.weight"   # names of one length
    dims, typ, off = heads[first]
    if case == "magic":
        data[:4] = b"GGML"
    elif case == "version":
        struct.pack_into("<I", data, 4, 7)
    elif case == "count":
        struct.pack_into("<Q", data, 8, 1 << 40)
    elif case == "dims":
        struct.pack_into("<Q", data, dims, 0)
    elif case == "type":
        struct.pack_into("<I", data, typ, 13)
    elif case == "offset":
        struct.pack_into("<Q", data, off, len(data))
    elif case == "misaligned":
        struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, off)[0] + 1)
    elif case == "overlap":
        struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, heads[second][2])[0])
    elif case in ("name", "duplicate"):
        old = first.encode()
        new = (b"blk.0.attn_x.weight" if case == "name" else second.encode())
        at = data.index(struct.pack("<Q", len(old)) + old)
        data[at + 8: at + 8 + len(old)] = new
    elif case == "nan":
        start = f.tensors[first].start
        data[start: start + 2] = np.array([np.nan], np.float16).tobytes()
    elif case == "shape":
        key = b"llama.feed_forward_length"
        at = data.index(key) + len(key) + 4
        struct.pack_into("<I", data, at, struct.unpack_from("<I", data, at)[0] * 2)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=match):
        open_gguf_file(bad)


def test_the_load_check_reads_runs_of_rows(small_gguf, tmp_path, monkeypatch):
    """The check at load reads each tensor a run of whole rows at a time (no mapping that
    would make the whole file resident): the runs are `raw`'s bytes, and a scale out of
    fp16's range in a tensor's last row is still found when every run is one row."""
    f = GGUFFile(small_gguf)
    for name, t in f.tensors.items():
        for max_bytes in (1, 4000, 1 << 30):
            parts = list(f.raw_chunks(name, max_bytes))
            whole = f.raw(name)
            np.testing.assert_array_equal(np.concatenate(parts).reshape(whole.shape), whole)
            if max_bytes == 1 and len(t.shape) > 1:
                assert len(parts) == t.shape[0]
    data = bytearray(small_gguf.read_bytes())
    t = f.tensors["blk.0.attn_q.weight"]                 # Q4_0: fp16 d, then 16 bytes
    last_block = t.start + t.nbytes - 18
    data[last_block: last_block + 2] = np.array([np.inf], np.float16).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    one_row = GGUFFile.raw_chunks
    monkeypatch.setattr(GGUFFile, "raw_chunks", lambda self, name: one_row(self, name, 1))
    with pytest.raises(ModelLoadError, match="attn_q.weight holds values that are not finite"):
        open_gguf_file(bad)


def test_rows_are_read_not_mapped(small_gguf, tmp_path):
    """`read_rows` gives `raw`'s rows in the order asked (runs and repeats too), refuses
    rows past the end, and names a file cut short since it was opened. An embedding
    lookup through the weights leaves the file unmapped (mapped, the kernel's
    fault-around kept 53 MiB of a Qwen3 Q4_0 file resident after random prompts)."""
    f = GGUFFile(small_gguf)
    name = "token_embd.weight"
    whole = np.array(f.raw(name))
    f.close()
    rows = np.array([5, 6, 7, 0, 3, 3, whole.shape[0] - 1, 2, 1])
    np.testing.assert_array_equal(f.read_rows(name, rows), whole[rows])
    assert f.read_rows(name, np.array([], np.int64)).shape == (0, whole.shape[1])
    for bad in ([whole.shape[0]], [-1]):
        with pytest.raises(ModelLoadError, match=f"has {whole.shape[0]} rows"):
            f.read_rows(name, np.array(bad))
    arch, weights, _ = open_gguf_file(small_gguf)
    try:
        weights.close()                       # no mapping left from parsing the header
        got = weights.rows_fp32(arch.embed_name, np.array([9, 2, 2, 40]))
        mapped = Path("/proc/self/maps")
        if mapped.exists():
            assert str(small_gguf) not in mapped.read_text()
        np.testing.assert_array_equal(got, weights.fp32(arch.embed_name)[[9, 2, 2, 40]])
    finally:
        weights.close()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small_gguf.read_bytes())
    short = GGUFFile(cut)
    t = short.tensors[name]
    with open(cut, "r+b") as out:
        out.truncate(t.start + t.nbytes // 2)
    with pytest.raises(ModelLoadError, match=f"ends inside {name}"):
        short.read_rows(name, np.array([t.shape[0] - 1]))


def test_rows_come_from_the_file_checked_at_open(small_gguf, tmp_path):
    """`read_rows` reads through the descriptor opened and checked with the header, so
    a file put in its place since is not read; `close` closes that descriptor, and a
    read after it opens the path again."""
    path = tmp_path / "model.gguf"
    path.write_bytes(small_gguf.read_bytes())
    f = GGUFFile(path)
    name = "token_embd.weight"
    t = f.tensors[name]
    first = f.read_rows(name, np.array([0, 1]))
    other = bytearray(path.read_bytes())
    other[t.start: t.start + t.nbytes] = bytes(t.nbytes)   # the same header, zero rows
    replacement = tmp_path / "other.gguf"
    replacement.write_bytes(bytes(other))
    os.replace(replacement, path)
    np.testing.assert_array_equal(f.read_rows(name, np.array([0, 1])), first)
    fds = Path("/proc/self/fd")

    def open_on_it() -> int:   # descriptors of the replaced file, "<path> (deleted)"
        return sum(os.readlink(fd).startswith(str(path)) for fd in fds.iterdir()
                   if fd.is_symlink())

    if fds.exists():
        assert open_on_it() >= 1
    f.close()
    gc.collect()                                        # the dropped mapping's too
    if fds.exists():
        assert open_on_it() == 0
    assert not f.read_rows(name, np.array([0, 1])).any()    # the path's file now
    f.close()


def test_the_vocabulary_lists_are_dropped_once_the_tokenizer_holds_them(qwen3_hf, tmp_path):
    path = write_gguf(qwen3_hf, tmp_path / "v.gguf", "Q4_0", vocab=_vocab_of_512())
    arch, weights, tok = open_gguf_file(path)
    try:
        assert tok is not None and tok.vocab_size == 512
        assert tok.encode("hi there", add_special_tokens=False)
        left = weights.file.metadata
        assert not any(k.startswith("tokenizer.ggml.") and isinstance(v, list)
                       for k, v in left.items())
        assert left["tokenizer.ggml.model"] == "gpt2"     # the scalars stay
    finally:
        weights.close()


def test_unsupported_architecture_and_vocabulary_are_named(small_gguf, tmp_path):
    data = bytearray(small_gguf.read_bytes())
    key = b"general.architecture"
    at = data.index(key) + len(key) + 4 + 8
    data[at: at + 5] = b"bloom"
    bad = tmp_path / "bloom.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="'bloom' is not supported"):
        open_gguf_file(bad)
    from orion.tokenizers.gguf import gguf_tokenizer

    with pytest.raises(ModelLoadError, match="'llama' is not supported"):
        gguf_tokenizer({"tokenizer.ggml.model": "llama"}, "m.gguf")
    with pytest.raises(ModelLoadError, match="'tekken' is not supported"):
        gguf_tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "tekken"}, "m")
    # a merge whose result the vocabulary lacks: the tokenizers library panics on it
    with pytest.raises(ModelLoadError, match="does not make a tokenizer"):
        gguf_tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"],
                        "tokenizer.ggml.merges": ["a b"]}, "m.gguf")
