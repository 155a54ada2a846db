"""orion.perplexity against transformers: the same strided windows over the same text
on tiny random models saved by transformers (GPT-2; a Llama with Llama 3's tokenizer;
the Llama with a PEFT LoRA adapter), perplexities within fp16 tolerance (relative
1e-2) of PyTorch's fp32 ones, the same tokens scored."""

from __future__ import annotations

import math
import shutil

import pytest
from asset_paths import require_asset
from models.conftest import TINY, save_peaked_gpt2

import orion
from orion.errors import InvalidArgumentError
from orion.perplexity import Window, perplexity, token_nlls, windows

pytestmark = pytest.mark.native
torch = pytest.importorskip("torch", reason="PyTorch is the reference")
transformers = pytest.importorskip("transformers", reason="transformers is the reference")

RTOL = 1e-2
SETTINGS = [(64, 32), (64, 64), (48, 20)]   # (context, stride): overlapping, not, uneven
LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=128256,
             max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
             tie_word_embeddings=False, initializer_range=0.08, bos_token_id=128000,
             eos_token_id=128001)


def text(chars: int = 1000) -> str:
    return require_asset("text/tinyshakespeare_input.txt").read_text(encoding="utf-8")[:chars]


def hf_perplexity(model, ids, context, stride):
    """Hugging Face's perplexity guide, on transformers' model and loss. (The guide
    weights each window's mean loss by its labels minus one, which is one too few for
    every window after the first; this weights it by the tokens the loss averaged.)"""
    nll_sum, n, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + context, len(ids))
        trg_len = end - prev_end
        input_ids = torch.tensor([ids[begin:end]])
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(input_ids, labels=target_ids).loss
        scored = int((target_ids[:, 1:] != -100).sum())
        nll_sum += float(loss) * scored
        n += scored
        prev_end = end
        if end == len(ids):
            break
    return math.exp(nll_sum / n), n


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_peaked_gpt2(tmp_path_factory.mktemp("gpt2_ppl"), TINY)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**LLAMA)
    folder = tmp_path_factory.mktemp("llama_ppl")
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    for f in require_asset("tokenizers/llama3").iterdir():
        shutil.copy(f, folder / f.name)
    return folder


def _hf_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()


def _orion(folder, ids, settings, **load):
    """Orion's figures for each (context, stride), on one loaded model."""
    model, _ = orion.load(folder, **load)
    try:
        return [perplexity(model, ids, context=c, stride=s) for c, s in settings]
    finally:
        model.close()


@pytest.mark.slow
def test_gpt2_equals_transformers(gpt2_dir):
    gpt2 = require_asset("gpt2")
    ref_tok = transformers.GPT2Tokenizer(str(gpt2 / "encoder.json"), str(gpt2 / "vocab.bpe"))
    model, tokenizer = orion.load(gpt2_dir)
    model.close()
    ids = tokenizer.encode(text())
    assert ids == ref_tok(text())["input_ids"]        # the same text, the same tokens
    reference = _hf_model(gpt2_dir)
    for (context, stride), ours in zip(SETTINGS, _orion(gpt2_dir, ids, SETTINGS), strict=True):
        theirs, n = hf_perplexity(reference, ids, context, stride)
        assert ours.tokens == n
        assert ours.perplexity == pytest.approx(theirs, rel=RTOL), (context, stride)


@pytest.mark.slow
def test_llama_equals_transformers(llama_dir):
    ids = orion.load(llama_dir)[1].encode(text())
    assert ids == transformers.AutoTokenizer.from_pretrained(llama_dir)(text())["input_ids"]
    reference = _hf_model(llama_dir)
    for (context, stride), ours in zip(SETTINGS[:2], _orion(llama_dir, ids, SETTINGS[:2]),
                                       strict=True):
        theirs, n = hf_perplexity(reference, ids, context, stride)
        assert ours.tokens == n
        assert ours.perplexity == pytest.approx(theirs, rel=RTOL), (context, stride)


@pytest.mark.slow
def test_llama_with_an_adapter_equals_peft(llama_dir, tmp_path):
    peft = pytest.importorskip("peft", reason="PEFT is the adapters' reference")
    from peft_adapters import peft_adapter

    adapter = peft_adapter(llama_dir, tmp_path / "adapter", seed=1,
                           targets=("q_proj", "v_proj", "down_proj"))
    ids = orion.load(llama_dir)[1].encode(text(800))
    reference = peft.PeftModel.from_pretrained(_hf_model(llama_dir), adapter).eval()
    theirs, _ = hf_perplexity(reference, ids, 64, 32)
    (ours,) = _orion(llama_dir, ids, [(64, 32)], adapter_path=adapter)
    (base,) = _orion(llama_dir, ids, [(64, 32)])
    assert ours.perplexity == pytest.approx(theirs, rel=RTOL)
    assert abs(ours.perplexity / base.perplexity - 1) > 3 * RTOL   # the adapter counts


def test_windows_score_every_token_after_the_first_once():
    for n, context, stride in [(10, 4, 2), (10, 4, 4), (10, 4, 3), (3, 8, 4), (9, 4, 1)]:
        plan = windows(n, context, stride)
        scored = [t for w in plan for t in range(w.scored_from, w.end)]
        assert scored == list(range(1, n)) if stride < context else \
            scored == [t for t in range(1, n) if t not in {w.begin for w in plan}]
        assert all(w.end - w.begin <= context and w.begin < w.scored_from for w in plan)
    assert windows(10, 4, 2)[:2] == [Window(0, 4, 1), Window(2, 6, 4)]


def test_token_nlls_is_a_log_softmax():
    import numpy as np

    logits = np.random.default_rng(0).standard_normal((130, 7)).astype(np.float32) * 30
    targets = list(range(130))[:130]
    targets = [t % 7 for t in targets]
    expected = -torch.log_softmax(torch.from_numpy(logits).double(), dim=1)[
        torch.arange(130), torch.tensor(targets)].numpy()
    assert np.allclose(token_nlls(logits, targets), expected, rtol=1e-12, atol=1e-9)


def test_refusals(gpt2_dir):
    model, tok = orion.load(gpt2_dir)
    try:
        with pytest.raises(InvalidArgumentError, match="at least 2 tokens"):
            perplexity(model, [5])
        with pytest.raises(InvalidArgumentError, match="window must be 2 to 256"):
            perplexity(model, [5, 6, 7], context=1000)
        with pytest.raises(InvalidArgumentError, match="stride must be in"):
            perplexity(model, [5, 6, 7], context=8, stride=9)
        with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
            perplexity(model, [5, 60000])
    finally:
        model.close()


def test_uniform_logits_give_the_vocabulary_size_and_progress_is_told():
    """A model that knows nothing: every token has probability 1/V, perplexity V."""
    import numpy as np

    class Uniform:
        config = type("C", (), {"vocab_size": 50})()
        max_length = 32
        prefill_buckets = (16, 32)

        def prefill(self, ids, *, all_logits=False):
            assert all_logits
            return np.full((len(ids), 50), 3.0, np.float32)

        def reset(self):
            pass

    seen = []
    result = perplexity(Uniform(), list(range(40)), context=16, stride=8,
                        progress=lambda done, total: seen.append((done, total)))
    assert result.perplexity == pytest.approx(50, rel=1e-12) and result.tokens == 39
    assert seen == [(i, result.windows) for i in range(1, result.windows + 1)]
