"""Quantized decode, one table from one run: Orion on vane against llama.cpp on the same
GGUF files, Q4_0, Q4_K_M and Q8_0 as llama.cpp's own quantizer writes them from an f16
GGUF of the same random weights, for GPT-2 124M and the Qwen3-0.6B shape (all 28
layers). Beside them Orion on the fp16 weights.

Each peer runs in its own process and the rounds are interleaved (decode_peers.py says
why); decode is the best round of greedy tokens after a 16-token prompt, prefill the
median of the rounds' 128-token prompts, 2 threads. Per format: the ratio Orion /
llama.cpp (target >= 1.0x), the bound the compressed bytes set (the bytes Orion's
programs hold per token over the read bandwidth of as many threads, measured in the
same run; moonshot: Orion within 85% of it) and llama.cpp's share of its own bound,
the ratio of the two peers' bytes a token (the device's forms of Q4_K and Q6_K are
larger than llama.cpp's), and each Orion process's peak RSS against its compressed
weight bytes plus its KV cache (target <= 1.3x). Beside them, Orion on the same fp16
weights palettized at 4 bits (`orion convert --palettize`: the ANE's preferred form, a
table per 16 channels): other codes than the GGUFs', so its ratio to llama.cpp's Q4_0 is
a speed figure, not a like-for-like one. Figures are printed, never asserted.

llama-cpp-python builds llama.cpp from source (10-30 minutes on 2 cores): run
`benchmarks/build_llama_cpp.sh` once; until then this benchmark skips and says so.
"""

from __future__ import annotations

import ctypes
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS
from decode_peers import PeerProcess, interleaved_rounds
from gguf_gpt2 import write_gpt2_gguf
from gguf_qwen3 import write_qwen3_gguf
from test_bench_gpt2 import PROMPT_DECODE, PROMPT_PREFILL, read_bandwidth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from asset_paths import require_asset  # noqa: E402
from models.hf_fixtures import PUBLISHED, save_numpy_init  # noqa: E402

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed: run benchmarks/build_llama_cpp.sh "
    "once (it builds llama.cpp from source; the `bench` extra)")
pytest.importorskip("gguf", reason="the GGUF writer is the `gguf` package")

FORMATS = {"Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
           "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}
ROUNDS = 3
SETTLE_S = 2.0
KV_BUCKET = 256      # OrionRunner's decode bucket


def quantize(f16: Path, fmt: str) -> Path:
    """llama.cpp's own quantizer (Q4_K_M: Q4_K and Q6_K tensors, as llama-quantize)."""
    out = f16.with_name(f"{f16.stem.removesuffix('-f16')}-{fmt}.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FORMATS[fmt])
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(),
                                          ctypes.byref(params)) == 0
    return out


def device_bytes(path: Path) -> tuple[int, int]:
    """(weight bytes Orion's programs hold, KV cache bytes at the decode bucket): each
    matrix as its compressed form, the rest fp16; a tied classifier once."""
    from orion.models.registry import open_gguf_file, open_hf

    if path.suffix == ".gguf":
        arch, weights, _ = open_gguf_file(path)
    else:
        arch, weights = open_hf(path)
    try:
        total = 0
        host = {arch.embed_name, "transformer.wpe.weight"} - {arch.classifier_name}
        for name in arch.parameters():
            if name in host:          # read row by row on the host, never resident
                continue
            q = weights.quant(name) if hasattr(weights, "quant") else None
            total += q.nbytes if q is not None else 2 * int(np.prod(weights.shape(name)))
    finally:
        weights.close()
    a = arch.args
    return total, a.n_layers * 2 * a.kv_dim * KV_BUCKET * 2


def llama_cpp_bytes(path: Path) -> int:
    """The bytes of the GGUF's tensors llama.cpp reads whole for a token: all but the
    embedding tables it looks rows up in (the token table too, unless it is also the
    classifier, as in a tied file)."""
    import gguf

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    lookups = {"position_embd.weight"}
    if "output.weight" in tensors:
        lookups.add("token_embd.weight")
    return sum(n for name, n in tensors.items() if name not in lookups)


def quant_table(figures, label: str, fp16: Path, f16_gguf: Path, make_prompt,
                decode_tokens: int) -> None:
    from orion.convert import palettize_folder

    files = {fmt: quantize(f16_gguf, fmt) for fmt in FORMATS}
    lut4 = palettize_folder(fp16, f16_gguf.with_name(f"{f16_gguf.stem}-lut4"), bits=4,
                            group_channels=16)
    paths: dict[str, tuple[str, Path]] = {"orion fp16": ("orion", fp16),
                                          "orion lut4": ("orion", lut4)}
    for fmt, path in files.items():
        paths[f"orion {fmt}"] = ("orion", path)
        paths[f"llama.cpp {fmt}"] = ("llama.cpp", path)
    peers: dict[str, PeerProcess] = {}
    rss: dict[str, int] = {}
    try:
        for name, (kind, path) in paths.items():
            peers[name] = PeerProcess(kind, path, THREADS, PROMPT_PREFILL)
        tps, ms = interleaved_rounds(peers, make_prompt, PROMPT_PREFILL, PROMPT_DECODE,
                                     decode_tokens, ROUNDS, SETTLE_S, label=label)
        rss = {name: peer.call("rss") for name, peer in peers.items()}
    finally:
        for peer in peers.values():
            peer.close()
    time.sleep(SETTLE_S)
    bandwidth = read_bandwidth(THREADS)   # the peers decode on THREADS threads
    for name in peers:
        figures.add(f"{label} decode, {name}", tps[name], "tok/s")
    for name in peers:
        figures.add(f"{label} prefill 128, {name}", ms[name], "ms")
    for fmt, path in files.items():
        figures.ratio(f"{label} decode tok/s, Orion / llama.cpp {fmt} (target >= 1.0x)",
                      tps[f"orion {fmt}"], tps[f"llama.cpp {fmt}"])
        weights, kv = device_bytes(path)
        bound = bandwidth / weights
        figures.add(f"{label} {fmt}: Orion's weight bytes a token", weights / 2**20, "MiB")
        figures.add(f"{label} {fmt}: Orion decode / bandwidth bound (moonshot >= 0.85)",
                    tps[f"orion {fmt}"] / bound, "x")
        # each peer reads its weights once a token: where both ran at one share of the
        # bandwidth, Orion / llama.cpp would be the ratio of their bytes
        # (docs/quantization.md, "On a Zen 4: what bounds the 4-bit rows")
        theirs = llama_cpp_bytes(path)
        figures.add(f"{label} {fmt}: llama.cpp decode / bandwidth bound",
                    tps[f"llama.cpp {fmt}"] * theirs / bandwidth, "x")
        figures.add(f"{label} {fmt}: llama.cpp's weight bytes a token / Orion's",
                    theirs / weights, "x")
        figures.add(f"{label} {fmt}: Orion peak RSS / (weights + KV cache) (target <= 1.3)",
                    rss[f"orion {fmt}"] / (weights + kv), "x")
        figures.add(f"{label} {fmt}: peak RSS, Orion / llama.cpp", rss[f"orion {fmt}"] /
                    rss[f"llama.cpp {fmt}"], "x")
    figures.ratio(f"{label} decode tok/s, Orion palettized 4-bit / llama.cpp Q4_0 (other "
                  "codes of the same weights)", tps["orion lut4"], tps["llama.cpp Q4_0"])
    weights, kv = device_bytes(lut4)
    figures.add(f"{label} lut4: Orion's weight bytes a token", weights / 2**20, "MiB")
    figures.add(f"{label} lut4: Orion peak RSS / (weights + KV cache)",
                rss["orion lut4"] / (weights + kv), "x")
    weights, kv = device_bytes(fp16)
    figures.add(f"{label} fp16: Orion peak RSS / (weights + KV cache)",
                rss["orion fp16"] / (weights + kv), "x")
    figures.add(f"{label} read bandwidth ({THREADS} threads, 256 MiB)", bandwidth / 1e9, "GB/s")


def test_gpt2_quantized_decode_against_llama_cpp(gpt2_dir, figures, tmp_path):
    import transformers

    f16 = write_gpt2_gguf(gpt2_dir, tmp_path / "gpt2-f16.gguf")
    vocab = transformers.GPT2Config().vocab_size

    def prompt(n: int) -> list[int]:
        return [int(i) for i in np.random.default_rng(n).integers(0, vocab, n)]

    quant_table(figures, "[gpt2 quantized]", gpt2_dir, f16, prompt, 64)


def test_qwen3_shape_quantized_decode_against_llama_cpp(figures, tmp_path):
    config = PUBLISHED["Qwen3-0.6B"]
    folder = save_numpy_init(tmp_path / "qwen3-0.6b", config)
    for f in require_asset("tokenizers/qwen2").iterdir():   # the GGUF's vocabulary
        shutil.copy(f, folder / f.name)
    f16 = write_qwen3_gguf(folder, tmp_path / "qwen3-f16.gguf")

    def prompt(n: int) -> list[int]:
        return [int(i) for i in np.random.default_rng(n).integers(0, config["vocab_size"], n)]

    quant_table(figures, "[qwen3 quantized]", folder, f16, prompt, 32)
