"""Programs reused across runs: a model whose programs an earlier load (or process)
compiled opens them from the program store, compiling nothing, with the same logits;
weights that change are a new key, never a stale program."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from child_process import OUTSIDE, child_env

from models.conftest import TINY, save_peaked_gpt2
from orion.models import load_model
from orion.runtime import compile_count

IDS = [int(i) for i in np.random.default_rng(1).integers(0, 2048, 24)]
OPTIONS = {"prefill_buckets": (32,), "decode_buckets": (32, 64), "reuse_programs": True}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ORION_CACHE_MAX_BYTES", raising=False)
    return tmp_path / "cache" / "store"


def generate(folder) -> tuple[list[np.ndarray], object]:
    m = load_model(folder, **OPTIONS)
    try:
        out = [m.prefill(IDS[:20])] + [m.decode(t) for t in IDS]
        return out, m
    finally:
        m.close()


@pytest.mark.slow
def test_a_second_load_compiles_nothing_and_gives_the_same_logits(tmp_path, store):
    folder = save_peaked_gpt2(tmp_path / "gpt2", dict(TINY, vocab_size=2048))
    first, m1 = generate(folder)
    assert m1.stats.programs_compiled == 4 and m1.stats.programs_reused == 0
    spent = compile_count()
    m = load_model(folder, **OPTIONS)
    assert m.compiles_needed == 0          # counted at load: all four are in the store
    m.close()
    again, m2 = generate(folder)
    assert compile_count() == spent
    assert m2.stats.programs_compiled == 0 and m2.stats.programs_reused == 4
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    # other weights in the same place: other keys, compiled again
    save_peaked_gpt2(tmp_path / "gpt2", dict(TINY, vocab_size=2048), seed=5)
    changed, m3 = generate(folder)
    assert m3.stats.programs_compiled == 4 and m3.stats.programs_reused == 0
    assert not np.array_equal(changed[0], first[0])
    assert len(list(store.iterdir())) == 8


@pytest.mark.slow
def test_a_second_generate_process_compiles_nothing(tmp_path):
    """`orion generate` twice (the shipped model): the second process opens every
    program the first compiled from the store; the plan line at load counts only the
    programs no process compiled yet (buckets the first did not use)."""
    env = child_env(ORION_CACHE_DIR=str(tmp_path / "cache"), ORION_PROGRAM_STORE="on")
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "orion", "generate", "To be",
                              "--max-tokens", "40", "--stats"], cwd=OUTSIDE, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(out)
    first, second = (re.search(r"programs compiled (\d+), reused (\d+)", r.stderr).groups()
                     for r in runs)
    assert int(first[0]) > 0 and first[1] == "0"
    assert second == ("0", first[0])
    assert runs[1].stdout == runs[0].stdout
    to_compile = [int(re.search(r"; (\d+) of them to compile", r.stderr).group(1))
                  for r in runs]
    assert to_compile[1] == to_compile[0] - int(first[0])
