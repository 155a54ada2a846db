"""orion.generate: the loop, streaming in whole characters, stop strings, stats; and
the real tiny GPT-2 on the backend against the numpy reference and transformers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import pytest
from models.conftest import TINY, save_peaked_gpt2
from models.gpt2_reference import forward

import orion
from orion.generate import GenerationStats, StreamingDetokenizer, generate, stream_generate
from orion.models.base import CausalLM, ModelStats
from orion.tokenizers.gpt2 import GPT2Tokenizer

TOKENIZER = GPT2Tokenizer.default()


class ScriptedLM:
    """A CausalLM whose logits always make the next token of a fixed script the
    argmax: it drives the generation loop with exactly known tokens."""

    def __init__(self, script: Sequence[int], max_length: int = 512) -> None:
        self.config = SimpleNamespace(vocab_size=50257)
        self.tokenizer = TOKENIZER
        self.stats = ModelStats()
        self.script = list(script)
        self._pos = 0
        self._step = 0
        self._max = max_length

    position = property(lambda self: self._pos)
    max_length = property(lambda self: self._max)
    prefill_buckets = property(lambda self: (self._max,))
    backend = property(lambda self: "scripted")

    def _logits(self) -> np.ndarray:
        logits = np.zeros(50257, np.float32)
        if self._step < len(self.script):
            logits[self.script[self._step]] = 10.0
        self._step += 1
        return logits

    def prefill(self, ids, *, all_logits=False):
        self._pos, self._step = len(ids), 0
        self.stats.prefill_calls += 1
        return self._logits()

    def decode(self, token):
        self._pos += 1
        self.stats.decode_calls += 1
        return self._logits()

    def reset(self):
        self._pos = 0

    def truncate(self, n):
        self._pos = min(self._pos, n)

    def load_adapter(self, path, name="default"):
        raise NotImplementedError

    def set_adapter(self, name):
        if name is not None:
            raise NotImplementedError

    active_adapter = property(lambda self: None)

    def close(self):
        pass


def script_of(text: str, eos: bool = False) -> list[int]:
    return TOKENIZER.encode(text) + ([TOKENIZER.eos_token_id] if eos else [])


def test_scripted_lm_is_a_causal_lm():
    assert isinstance(ScriptedLM([1]), CausalLM)


def test_every_piece_is_whole_characters():
    text = "naïve 🎉 café 日本語 👩‍👩‍👧 end"
    model = ScriptedLM(script_of(text, eos=True))
    pieces = [r.text for r in stream_generate(model, "x", max_tokens=100)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    emoji_ids = TOKENIZER.encode(" 🎉")
    assert len(emoji_ids) > 1          # the emoji spans tokens, so some yield is empty
    assert "" in pieces


def test_finish_reasons_and_counts():
    model = ScriptedLM(script_of("one two three", eos=True))
    stats = GenerationStats()
    assert generate(model, "x", max_tokens=100, stats=stats) == "one two three"
    assert stats.finish_reason == "eos" and stats.generated_tokens == 3
    stats = GenerationStats()
    assert generate(model, "x", max_tokens=2, stats=stats) == "one two"
    assert stats.finish_reason == "length" and stats.generated_tokens == 2
    assert model.stats.decode_calls == 3 + 1   # none after the last token of a call
    out = generate(model, "x", max_tokens=100, stop_at_eos=False)
    assert out.startswith("one two three<|endoftext|>")


def test_stop_strings():
    model = ScriptedLM(script_of("Hello world. STOP here", eos=True))
    stats = GenerationStats()
    assert generate(model, "x", stop=["STOP"], stats=stats) == "Hello world. "
    assert stats.finish_reason == "stop"
    # a stop string spanning tokens, and text held back while it might still match
    pieces = [r.text for r in stream_generate(model, "x", stop=[". ST"])]
    assert "".join(pieces) == "Hello world"
    # a prefix that never completes is released at the end
    assert generate(model, "x", stop=["here!"]) == "Hello world. STOP here"


def test_context_limit_ends_generation():
    model = ScriptedLM(script_of("a b c d e f g"), max_length=5)
    stats = GenerationStats()
    generate(model, [1, 2, 3], max_tokens=100, stats=stats)
    assert stats.finish_reason == "length" and stats.generated_tokens == 3


def test_empty_prompt_starts_from_endoftext():
    model = ScriptedLM(script_of("hi"))
    assert generate(model, "", max_tokens=1) == "hi"


def test_detokenizer_when_bytes_do_not_concatenate():
    class TextOnly:
        vocab_size = TOKENIZER.vocab_size
        eos_token_id = TOKENIZER.eos_token_id
        bytes_concatenate = False
        encode = staticmethod(TOKENIZER.encode)
        decode = staticmethod(TOKENIZER.decode)

        def decode_bytes(self, ids):
            raise AssertionError("a stream must re-decode when bytes do not concatenate")

    detok = StreamingDetokenizer(TextOnly())
    pieces = [detok.add(t) for t in TOKENIZER.encode("a🎉b")] + [detok.flush()]
    assert "".join(pieces) == "a🎉b" and all("\ufffd" not in p for p in pieces)


# ---- the real tiny GPT-2 -------------------------------------------------------------

pytestmark_native = pytest.mark.native


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_peaked_gpt2(tmp_path_factory.mktemp("gpt2_tiny"), TINY)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from orion.runtime import compile_budget, set_compile_budget

    old = compile_budget()
    set_compile_budget(1_000_000)   # this module loads two models; see tests/models
    model, _ = orion.load(tiny_dir, prefill_buckets=(32,), decode_buckets=(64,))
    yield model
    model.close()
    set_compile_budget(old)


def reference_greedy(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(np.argmax(forward(model.config, model.weights, ids)[-1])))
    return ids


@pytest.mark.slow
@pytestmark_native
def test_greedy_matches_the_numpy_reference(tiny):
    prompt = TOKENIZER.encode("The quick brown fox")
    expected = reference_greedy(tiny, prompt, 12)[len(prompt):]
    out = generate(tiny, prompt, max_tokens=12, stop_at_eos=False)
    assert out == TOKENIZER.decode(expected)


@pytestmark_native
def test_greedy_matches_transformers(tiny, tiny_dir):
    torch = pytest.importorskip("torch", reason="the HF reference needs torch (test-only)")
    transformers = pytest.importorskip("transformers", reason="the HF reference is test-only")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    prompt = TOKENIZER.encode("Once upon a time")
    with torch.no_grad():
        seq = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                          pad_token_id=0, eos_token_id=None)[0].tolist()
    out = generate(tiny, prompt, max_tokens=24, stop_at_eos=False)
    assert out == TOKENIZER.decode(seq[len(prompt):])


@pytestmark_native
def test_seed_reproduces_sampling(tiny):
    opts = {"max_tokens": 16, "temperature": 5.0, "top_k": 50, "seed": 11}
    a = generate(tiny, "Hello", **opts)
    b = generate(tiny, "Hello", **opts)
    c = generate(tiny, "Hello", **{**opts, "seed": 12})
    assert a == b and a != c


@pytestmark_native
def test_stats_of_a_warm_model(tiny):
    generate(tiny, "warm up", max_tokens=4)
    stats = GenerationStats()
    generate(tiny, "Hello there", max_tokens=8, stop_at_eos=False, stats=stats)
    assert stats.programs_compiled == 0
    n = tiny.plan.decode_evals   # its layer programs and head programs
    # prefill: the layer programs + head; 7 decode steps of the same
    assert stats.cache_hits == n * 8
    assert stats.prefill_ms > 0 and stats.decode_steps == 7 and stats.decode_tokens_per_s > 0
    assert stats.prompt_tokens == 2 and stats.generated_tokens == 8


@pytest.mark.slow
@pytestmark_native
def test_orion_load_returns_model_and_tokenizer(tiny_dir):
    model, tokenizer = orion.load(tiny_dir, decode_buckets=(32,), prefill_buckets=(32,))
    try:
        assert model.tokenizer is tokenizer
        assert tokenizer.encode("Hello") == [15496]
        assert isinstance(orion.generate(model, "Hi", max_tokens=3), str)
    finally:
        model.close()


def test_context_cut_is_told_apart_from_max_tokens():
    stats = GenerationStats()
    generate(ScriptedLM(script_of("a b c d e f g"), max_length=5), [1, 2, 3], max_tokens=100,
             stats=stats)
    assert stats.finish_reason == "length" and stats.cut_at_context
    assert stats.summary().endswith("finish: length (cut at the context)")
    generate(ScriptedLM(script_of("a b c d e f g")), [1, 2, 3], max_tokens=2, stats=stats)
    assert stats.finish_reason == "length" and not stats.cut_at_context


def test_generation_types_are_exported():
    assert orion.GenerationStats is GenerationStats
    assert {"GenerationStats", "GenerationResponse"} <= set(orion.__all__)


def test_stream_generate_docstring_documents_every_option():
    import inspect

    doc = stream_generate.__doc__
    for name in inspect.signature(stream_generate).parameters:
        assert re.search(rf"^\s+{name}:\s+\S", doc, re.M), f"{name} is not documented"
    assert "stop_at_eos:" in doc


@pytest.mark.slow
@pytestmark_native
def test_load_without_a_path_loads_the_shipped_model():
    from orion.models import default_model_path

    model, tokenizer = orion.load()
    try:
        shipped, _ = orion.load(default_model_path())
        assert repr(model) == repr(shipped) and tokenizer.identity == shipped.tokenizer.identity
        shipped.close()
        assert "Llama" in repr(model) and tokenizer.vocab_size == 2048
        assert orion.generate(model, "ROMEO:", max_tokens=8)
    finally:
        model.close()


def test_stops_on_any_end_token():
    """A tokenizer with several end tokens (Llama 3: <|eot_id|>, <|end_of_text|>...)
    stops on whichever comes."""

    class ManyEnds:
        def __init__(self):
            self.eos_token_id, self.eos_token_ids = 50256, (50256, 13, 11)
            self.vocab_size, self.bytes_concatenate = TOKENIZER.vocab_size, False

        def encode(self, text):
            return TOKENIZER.encode(text)

        def decode(self, ids):
            return TOKENIZER.decode(ids)

    lm = ScriptedLM([40, 41, 11, 42])
    lm.tokenizer = ManyEnds()
    stats = GenerationStats()
    assert generate(lm, [1], max_tokens=10, stats=stats) == TOKENIZER.decode([40, 41])
    assert stats.finish_reason == "eos"


class CompilingLM(ScriptedLM):
    """A ScriptedLM whose prefill and first decode step spend 30 ms "compiling"."""

    def _compile(self):
        import time

        t = time.perf_counter()
        time.sleep(0.03)
        self.stats.compile_ms += 1e3 * (time.perf_counter() - t)

    def prefill(self, ids, *, all_logits=False):
        self._compile()
        return super().prefill(ids, all_logits=all_logits)

    def decode(self, token):
        if self.stats.decode_calls == 0:
            self._compile()
        return super().decode(token)


def test_compiling_is_reported_apart_from_prefill_and_decode():
    """The stats line's three figures do not overlap: compiles are compile_ms's alone."""
    stats = GenerationStats()
    generate(CompilingLM(script_of("a b c")), [1, 2], max_tokens=3, stats=stats)
    assert stats.compile_ms >= 60
    assert stats.prefill_ms < 25 and stats.decode_ms < 25


@pytest.mark.slow
def test_text_prompts_get_a_bos_where_transformers_adds_one(tmp_path):
    """stream_generate encodes text as transformers' tokenizer(text) does: with the BOS
    that the post-processor of Meta's Llama 3 tokenizer.json adds (the docstring says so)."""
    import json
    import shutil

    from asset_paths import require_asset

    from orion.tokenizers.hf import HFTokenizer

    transformers = pytest.importorskip("transformers")
    for f in require_asset("tokenizers/llama3").iterdir():
        shutil.copy(f, tmp_path / f.name)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    spec["post_processor"] = {   # Meta's own file's (the converted one adds nothing)
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                 "tokens": ["<|begin_of_text|>"]}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    seen = []

    class Recording(ScriptedLM):
        def prefill(self, ids, *, all_logits=False):
            seen.append(list(ids))
            return super().prefill(ids, all_logits=all_logits)

    model = Recording(script_of("a"))
    model.tokenizer = HFTokenizer.from_folder(tmp_path)
    model.config = SimpleNamespace(vocab_size=128256)   # Llama 3's ids
    generate(model, "Hello there", max_tokens=1)
    expected = transformers.AutoTokenizer.from_pretrained(tmp_path)("Hello there")["input_ids"]
    assert seen == [expected] and expected[0] == 128000
    assert "a tokenizer.json folder adds a BOS where transformers'" in stream_generate.__doc__
