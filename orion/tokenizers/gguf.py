"""The tokenizer a GGUF file carries in its metadata, as a Hugging Face `tokenizers`
tokenizer (orion.tokenizers.hf), with the file's chat template.

    tokenizer.ggml.model        "gpt2": byte-level BPE (GPT-2, Llama 3, Qwen2/3, ...)
    tokenizer.ggml.pre          the pre-tokenizer's regex, by llama.cpp's name for it
    tokenizer.ggml.tokens       the vocabulary, by id
    tokenizer.ggml.merges       "a b" merge rules in rank order
    tokenizer.ggml.token_type   1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
    tokenizer.ggml.{bos,eos,eot,eom}_token_id, add_bos_token
    tokenizer.chat_template     a Jinja template, as tokenizer_config.json holds it

This is what llama.cpp's convert_hf_to_gguf.py writes from a tokenizer.json, turned
back. SentencePiece vocabularies ("llama") and pre-tokenizers not listed in `PRE` are
refused by name; a file with no vocabulary ("no_vocab") has no tokenizer (None).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from orion.errors import ModelLoadError
from orion.tokenizers.backend import backend_from_document
from orion.tokenizers.chat_template import ChatTemplate
from orion.tokenizers.hf import HFTokenizer

_GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
           r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}"
          r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's pre-tokenizer name -> (regex, NFC normalizer, BPE ignore_merges)
PRE = {"gpt-2": (_GPT2, False, False), "default": (_GPT2, False, False),
       "llama-bpe": (_LLAMA3, False, True), "llama3": (_LLAMA3, False, True),
       "smaug-bpe": (_LLAMA3, False, True),
       "qwen2": (_QWEN2, True, False)}
CONTROL, USER_DEFINED = 3, 4


def _list(meta: Mapping[str, Any], key: str, kind: type, where: str) -> list[Any]:
    v = meta.get(key)
    if not isinstance(v, list) or not all(isinstance(x, kind) and not isinstance(x, bool)
                                          for x in v):
        raise ModelLoadError(f"{where}: {key} is missing or not a list of {kind.__name__}")
    return v


def _token_id(meta: Mapping[str, Any], key: str, n: int, where: str) -> int | None:
    v = meta.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
        raise ModelLoadError(f"{where}: {key} {v!r} is not a token id below {n}")
    return v


def _backend_document(tokens: list[str], merges: list[str], types: list[int], pre: str,
                      where: str) -> dict[str, Any]:
    regex, nfc, ignore_merges = PRE[pre]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": types[i] == USER_DEFINED, "special": types[i] == CONTROL}
             for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    pairs = []
    for m in merges:
        parts = m.split(" ")
        if len(parts) != 2:
            raise ModelLoadError(f"{where}: merge {m[:40]!r} is not two tokens")
        pairs.append((parts[0], parts[1]))   # a tuple: what models.BPE takes, as JSON writes it
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                  "vocab": vocab, "merges": pairs}}


def gguf_tokenizer(meta: Mapping[str, Any], where: str) -> HFTokenizer | None:
    """The tokenizer of a GGUF file's metadata (see the module docstring)."""
    model = meta.get("tokenizer.ggml.model")
    if model in (None, "none", "no_vocab"):
        return None
    if model != "gpt2":
        raise ModelLoadError(f"{where}: tokenizer.ggml.model {model!r} is not supported "
                             "(Orion reads the byte-level BPE vocabularies, \"gpt2\")")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE:
        raise ModelLoadError(f"{where}: tokenizer.ggml.pre {pre!r} is not supported "
                             f"(known: {', '.join(sorted(PRE))})")
    tokens = _list(meta, "tokenizer.ggml.tokens", str, where)
    merges = _list(meta, "tokenizer.ggml.merges", str, where)
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if not isinstance(types, list) or len(types) != len(tokens) or not all(
            isinstance(t, int) for t in types):
        raise ModelLoadError(f"{where}: tokenizer.ggml.token_type does not give one type per "
                             "token")
    doc = _backend_document(tokens, merges, types, str(pre), where)
    text = json.dumps(doc)   # its hash names the tokenizer, as it always has
    try:
        backend = backend_from_document(doc, text)
    except BaseException as exc:  # noqa: BLE001 - the library's errors, or its Rust panic
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise ModelLoadError(f"{where}: the vocabulary does not make a tokenizer "
                             f"({str(exc)[:200]})") from None
    n = len(tokens)
    bos = _token_id(meta, "tokenizer.ggml.bos_token_id", n, where)
    eos = _token_id(meta, "tokenizer.ggml.eos_token_id", n, where)
    ends = [i for k in ("eos", "eot", "eom")
            if (i := _token_id(meta, f"tokenizer.ggml.{k}_token_id", n, where)) is not None]
    config: dict[str, Any] = {"add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token"))}
    if bos is not None:
        config["bos_token"] = tokens[bos]
    if eos is not None:
        config["eos_token"] = tokens[eos]
    tok = HFTokenizer(backend, config=config, generation={"eos_token_id": ends},
                      source=f"{where}: tokenizer.ggml",
                      identity="gguf-" + hashlib.sha256(text.encode()).hexdigest()[:16])
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        if not isinstance(template, str):
            raise ModelLoadError(f"{where}: tokenizer.chat_template is not a string")
        tok.chat_template = ChatTemplate(template, origin=f"{where}: tokenizer.chat_template",
                                         special_tokens=tok.special_tokens)
    return tok
