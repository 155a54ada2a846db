"""OpenAI's GPT-2 encoder (`encoder.py` of openai/gpt-2, MIT), restated as the
reference the tiktoken-based tokenizer is tested against: encoder.json + vocab.bpe,
the pre-tokenizer regex, and BPE by lowest merge rank, in plain Python."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import regex

SPECIAL = "<|endoftext|>"
PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def get_pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in zip(word, word[1:], strict=False)}


class ReferenceEncoder:
    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.encoder = encoder
        self.decoder = {v: k for k, v in encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.bpe_ranks = {m: i for i, m in enumerate(merges)}
        self.cache: dict[str, str] = {}

    @classmethod
    def from_files(cls, encoder_json: Path, vocab_bpe: Path) -> ReferenceEncoder:
        encoder = json.loads(encoder_json.read_text(encoding="utf-8"))
        lines = vocab_bpe.read_text(encoding="utf-8").split("\n")
        merges = [tuple(line.split()) for line in lines[1:] if line]
        return cls(encoder, merges)

    def bpe(self, token: str) -> str:
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        out = " ".join(word)
        self.cache[token] = out
        return out

    def encode_ordinary(self, text: str) -> list[int]:
        ids: list[int] = []
        for token in regex.findall(PATTERN, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return ids

    def encode(self, text: str) -> list[int]:
        """Special tokens as their ids, everything between them as ordinary text."""
        ids: list[int] = []
        for i, part in enumerate(text.split(SPECIAL)):
            if i:
                ids.append(self.encoder[SPECIAL])
            ids.extend(self.encode_ordinary(part))
        return ids

    def decode(self, ids: list[int]) -> str:
        text = "".join(self.decoder[i] for i in ids)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")
