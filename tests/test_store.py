"""The program store (csrc/core/store.c through `Program.compile(store_key=...)` and
`Program.open_stored`): a program compiled with a key is opened again, in this process
or another, without a compile on vane; the store keeps its size bound, removing least
recently used entries first, and touches only folders that carry Orion's marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from child_process import OUTSIDE, child_env

from orion.errors import InvalidArgumentError
from orion.runtime import Program, compile_count
from orion.runtime.blob import blob_bytes

pytestmark = pytest.mark.native

T = "tensor<fp16, [1, 768, 1, 32]>"
W = "tensor<fp16, [768, 768, 1, 1]>"
WKEY = "@model_path/weights/w.bin"


def conv_program(seed: int) -> tuple[str, dict[str, bytearray]]:
    """A 768x768 conv (1.1 MiB of weights); `seed` picks the weights."""
    w = np.random.default_rng(seed).normal(0, 0.02, (768, 768, 1, 1)).astype(np.float16)
    data, offsets = blob_bytes({"w": w})
    mil = ("program(1.3)\n{\n"
           f"    func main<ios18>({T} in_x) {{\n"
           f'        string pt = const()[name = string("pt"), val = string("valid")];\n'
           '        tensor<int32, [2]> st = const()[name = string("st"), '
           "val = tensor<int32, [2]>([1, 1])];\n"
           '        tensor<int32, [4]> pd = const()[name = string("pd"), '
           "val = tensor<int32, [4]>([0, 0, 0, 0])];\n"
           '        tensor<int32, [2]> dl = const()[name = string("dl"), '
           "val = tensor<int32, [2]>([1, 1])];\n"
           '        int32 gr = const()[name = string("gr"), val = int32(1)];\n'
           f'        {W} w = const()[name = string("w"), val = {W}(BLOBFILE(path = '
           f'string("{WKEY}"), offset = uint64({offsets["w"]})))];\n'
           f"        {T} out_y = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, "
           f'strides = st, weight = w, x = in_x)[name = string("out_y")];\n'
           "    } -> (out_y);\n}\n")
    return mil, {WKEY: data}


def key(n: int) -> str:
    return f"{n:064x}"


X = np.random.default_rng(9).normal(0, 1, (1, 768, 1, 32)).astype(np.float16)


def run(p: Program) -> np.ndarray:
    return p.run({"in_x": X})["out_y"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ORION_CACHE_MAX_BYTES", raising=False)
    return tmp_path / "cache"


def test_a_stored_program_opens_without_a_compile(cache):
    mil, weights = conv_program(0)
    assert Program.open_stored(key(1)) is None and not Program.is_stored(key(1))
    with Program.compile(mil, weights, backend="vane", store_key=key(1)) as first:
        expected = run(first)
    entry = cache / "store" / key(1)
    assert (entry / ".orion-program").is_file() and (entry / "model.mil").read_text() == mil
    assert Program.is_stored(key(1))
    spent = compile_count()
    with Program.open_stored(key(1), backend="vane") as again:
        assert compile_count() == spent
        np.testing.assert_array_equal(run(again), expected)
        assert again.folder != entry and (again.folder / ".orion-program").is_file()
    assert entry.is_dir()   # releasing the opened program leaves the store's entry


def test_another_process_opens_it_without_a_compile(cache):
    mil, weights = conv_program(1)
    with Program.compile(mil, weights, backend="vane", store_key=key(2)) as first:
        expected = run(first)
    np.save(cache.parent / "x.npy", X)
    code = ("import sys, numpy as np\n"
            "from orion.runtime import Program, compile_count\n"
            f"p = Program.open_stored({key(2)!r}, backend='vane')\n"
            f"y = p.run({{'in_x': np.load({str(cache.parent / 'x.npy')!r})}})['out_y']\n"
            f"np.save({str(cache.parent / 'y.npy')!r}, y)\n"
            "print(compile_count())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=OUTSIDE, capture_output=True,
                         text=True, env=child_env(ORION_CACHE_DIR=str(cache)), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"
    np.testing.assert_array_equal(np.load(cache.parent / "y.npy"), expected)


def test_keys_are_checked():
    mil, weights = conv_program(0)
    for bad in ("ABCDEF0123456789", "0123", "../" + "0" * 20, "g" * 32):
        with pytest.raises(InvalidArgumentError, match="hex digits"):
            Program.open_stored(bad)
        with pytest.raises(InvalidArgumentError, match="hex digits"):
            Program.compile(mil, weights, store_key=bad)


def test_the_store_keeps_its_bound_least_recently_used_first(cache, monkeypatch):
    entry = 1_200_000   # a little over one program's weights and MIL
    monkeypatch.setenv("ORION_CACHE_MAX_BYTES", str(2 * entry))
    store = cache / "store"
    for n in (1, 2):
        mil, weights = conv_program(n)
        Program.compile(mil, weights, backend="vane", store_key=key(n)).release()
    foreign = store / "not-ours"
    foreign.mkdir()
    (foreign / "data").write_bytes(b"x" * 3 * entry)   # no marker: never counted or removed
    os.utime(store / key(2) / ".orion-program", (1, 1))   # 2 was used long ago
    Program.open_stored(key(1)).release()                  # and 1 just now
    mil, weights = conv_program(3)
    Program.compile(mil, weights, backend="vane", store_key=key(3)).release()
    assert sorted(p.name for p in store.iterdir()) == sorted([key(1), key(3), "not-ours"])
    assert (foreign / "data").stat().st_size == 3 * entry


def test_a_store_bound_of_0_keeps_nothing(cache, monkeypatch):
    monkeypatch.setenv("ORION_CACHE_MAX_BYTES", "0")
    mil, weights = conv_program(4)
    Program.compile(mil, weights, backend="vane", store_key=key(4)).release()
    assert Program.open_stored(key(4)) is None
    assert not (cache / "store").exists()
