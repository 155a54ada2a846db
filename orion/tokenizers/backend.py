"""A `tokenizers.Tokenizer` from a tokenizer.json document, a BPE model's vocabulary and
merges handed to the library as Python objects.

The library's JSON reader first builds a tree of every vocabulary entry and merge
(about 450,000 small allocations for Qwen2's 151,665 tokens), then the tokenizer from
it, and frees the tree: its holes in the C heap stay resident, among blocks that live
on. A Qwen3-0.6B GGUF process held 55 MiB more at the end of its work with its
tokenizer read that way than with none (docs/quantization.md, "Peak RSS: the
tokenizer's build"). So for a BPE model the document less its vocabulary, merges and
added tokens goes through the reader (a few KiB), `tokenizers.models.BPE` builds the
model from the dict and the pairs, and the added tokens follow in the document's
order, as the reader adds them (each takes its id in the vocabulary, else the next free
one, whatever id the document names). Anything else (Unigram, WordPiece, a merge that
is not two tokens) goes through the reader whole. Both give the same tokenizer,
serialized byte for byte (tests/tokenizer/test_backend.py).

    backend = backend_from_document(json.loads(text), text)
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import AddedToken, models
from tokenizers import Tokenizer as Backend

# the BPE settings tokenizer.json holds beside vocab and merges, as models.BPE takes them
BPE_SETTINGS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges")
ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _bpe_parts(doc: Any) -> tuple[dict[str, int], list[tuple[str, str]], list[AddedToken]] | None:
    """The vocabulary, merges and added tokens of a BPE document, or None where the
    document is anything the library's reader should judge itself."""
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return None
    vocab, merges, added = model.get("vocab"), model.get("merges"), doc.get("added_tokens", [])
    if not isinstance(vocab, dict) or not isinstance(merges, list) or not isinstance(added, list):
        return None
    if not all(type(i) is int for i in vocab.values()):
        return None
    pairs = []
    for merge in merges:
        parts = merge.split(" ") if isinstance(merge, str) else merge   # the reader's split
        if not isinstance(parts, list | tuple) or len(parts) != 2 or not all(
                isinstance(p, str) for p in parts):
            return None
        pairs.append(parts if isinstance(parts, tuple) else (parts[0], parts[1]))
    tokens = []
    for t in added:
        if not isinstance(t, dict) or not isinstance(t.get("content"), str) or not all(
                type(t.get(f, False)) is bool for f in ADDED_TOKEN_FLAGS):
            return None
        tokens.append(AddedToken(t["content"], **{f: t[f] for f in ADDED_TOKEN_FLAGS if f in t}))
    return vocab, pairs, tokens


def backend_from_document(doc: Any, text: str | None = None) -> Backend:
    """The tokenizer of a parsed tokenizer.json (`text`: the same document as read, for
    the reader's own errors; else it is serialized again). Raises what the library raises
    on a document it refuses."""
    parts = _bpe_parts(doc)
    if parts is None:
        return Backend.from_str(text if text is not None else json.dumps(doc))
    vocab, pairs, added = parts
    model = doc["model"]
    shell = dict(doc, model=dict(model, vocab={}, merges=[]), added_tokens=[])
    backend = Backend.from_str(json.dumps(shell))   # everything around the model, checked
    backend.model = models.BPE(vocab=vocab, merges=pairs,
                               **{k: model[k] for k in BPE_SETTINGS if model.get(k) is not None})
    backend.add_tokens(added)
    return backend
