"""GPT-2's byte-level BPE through `tiktoken`, built from local files only.

The ranks file shipped in the package (`orion/assets/gpt2.tiktoken`, MIT, from
openai-whisper) is the default, so nothing is downloaded at run time. A model
folder's own tokenizer files take precedence over it, in this order:

    vocab.json + merges.txt     what transformers' GPT2Tokenizer saves
    encoder.json + vocab.bpe    OpenAI's original names for the same two files
    tokenizer.json              a transformers fast tokenizer (BPE model)

tiktoken ranks merged tokens by their bytes and uses the rank as the token id; a
vocabulary whose ids are not in merge order (any BPE other than GPT-2's own) is
encoded with merge ranks and its ids mapped through a table, so that encodings
agree with the merges file either way.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tiktoken

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import MAX_JSON_BYTES, MAX_TOKENIZER_BYTES, UnsafeFileError, inside, read_bytes
from orion.files import read_json as read_json_file
from orion.tokenizers.base import check_text

if TYPE_CHECKING:
    from orion.tokenizers.chat_template import ChatTemplate

ASSET = Path(__file__).resolve().parent.parent / "assets" / "gpt2.tiktoken"
ENDOFTEXT = "<|endoftext|>"
# tiktoken's r50k pattern: GPT-2's pre-tokenizer regex, with possessive quantifiers.
# Token ids and ranks past this are refused at load (tiktoken's ranks are 32-bit; a
# vocab.json id of 2**63 + 5 used to overflow numpy).
MAX_TOKEN_ID = (1 << 31) - 1
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's reversible map from the printable characters in vocab files to bytes."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _unprintable(token: str, source: Path) -> bytes:
    table = byte_decoder()
    try:
        return bytes(table[ch] for ch in token)
    except (KeyError, TypeError):  # the token's text is not echoed: the file may be anything
        raise ModelLoadError(f"{source}: a token that is not byte-level BPE "
                             f"({len(str(token))} characters)") from None


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A `.tiktoken` file: one `base64(token) rank` per line."""
    ranks: dict[bytes, int] = {}
    try:
        lines = read_bytes(path, max_bytes=MAX_TOKENIZER_BYTES).splitlines()
    except UnsafeFileError as exc:
        raise ModelLoadError(f"BPE ranks file {exc}") from None
    for lineno, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            if len(rank) > 10 or not 0 <= int(rank) <= MAX_TOKEN_ID:
                raise ValueError(rank)
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise ModelLoadError(f"{path}:{lineno}: not 'base64 rank' (a rank in "
                                 f"[0, {MAX_TOKEN_ID}])") from None
    return ranks


class GPT2Tokenizer:
    """Byte-level BPE: `encode(text) -> ids`, `decode(ids) -> str`, `decode_bytes`.

    Special tokens (`<|endoftext|>`) in the text are encoded as their ids unless
    `allow_special=False`, which encodes them as ordinary text.
    """

    def __init__(
        self,
        mergeable_ranks: Mapping[bytes, int],
        special_tokens: Mapping[str, int],
        *,
        ids: Sequence[int] | None = None,
        eos_token: str | None = ENDOFTEXT,
        name: str = "gpt2",
    ) -> None:
        """`ids[r]` is the token id of rank r (merge ranks, then the special tokens in
        the order given); None when ranks are the ids."""
        n_ranks = len(mergeable_ranks)
        specials_by_rank = {tok: n_ranks + i for i, tok in enumerate(special_tokens)}
        if ids is None:
            specials_by_rank = dict(special_tokens)
        self._encoding = tiktoken.Encoding(
            name=name, pat_str=GPT2_PATTERN, mergeable_ranks=dict(mergeable_ranks),
            special_tokens=specials_by_rank,
        )
        self._rank_to_id = None if ids is None else np.asarray(ids, dtype=np.int64)
        self._id_to_rank = (
            None if ids is None else {int(t): r for r, t in enumerate(ids)}
        )
        self._special = dict(special_tokens)
        self._vocab_size = (
            max([*mergeable_ranks.values(), *special_tokens.values()]) + 1
            if ids is None else int(max(ids)) + 1
        )
        self.eos_token_id = self._special.get(eos_token) if eos_token else None
        self.eos_token_ids: tuple[int, ...] = () if self.eos_token_id is None \
            else (self.eos_token_id,)
        self.identity = f"{name}-{self._vocab_size}"
        # byte-level BPE files (vocab.json + merges.txt) come with no template or defaults
        self.chat_template: ChatTemplate | None = None
        self.generation_defaults: dict[str, Any] = {}

    def __repr__(self) -> str:
        return (f"<GPT2Tokenizer {self._encoding.name!r}: byte-level BPE, {self.vocab_size} "
                f"tokens, {len(self._special)} special, eos {self.eos_token_id}>")

    # ---- constructors ---------------------------------------------------------

    @classmethod
    def default(cls) -> GPT2Tokenizer:
        """GPT-2's own vocabulary from the ranks file shipped with Orion."""
        return cls(read_tiktoken_ranks(ASSET), {ENDOFTEXT: 50256})

    @classmethod
    def from_vocab_merges(
        cls, vocab: Mapping[str, int], merges: Iterable[tuple[str, str]], source: Path,
        eos_token: str | None = ENDOFTEXT,
    ) -> GPT2Tokenizer:
        """From an encoder (token string -> id) and merges in priority order."""
        by_bytes = {_unprintable(tok, source): int(i) for tok, i in vocab.items()
                    if tok not in (ENDOFTEXT, "<|startoftext|>")}
        singles = sorted((i, b) for b, i in by_bytes.items() if len(b) == 1)
        if len(singles) != 256:
            raise ModelLoadError(f"{source}: {len(singles)} single-byte tokens, expected 256")
        ranks: dict[bytes, int] = {b: r for r, (_, b) in enumerate(singles)}
        ids = [i for i, _ in singles]
        for n, (a, b) in enumerate(merges, 1):
            merged = _unprintable(a, source) + _unprintable(b, source)
            if merged in ranks:
                continue  # a second way to build a token: the first merge ranks it
            if merged not in by_bytes:
                raise ModelLoadError(f"{source}: merge {n} makes a token the vocabulary lacks")
            ranks[merged] = len(ids)
            ids.append(by_bytes[merged])
        specials = {tok: int(i) for tok, i in vocab.items() if _is_special(tok)}
        ids += list(specials.values())
        if ids == list(range(len(ids))):
            return cls(ranks, specials, eos_token=eos_token)
        return cls(ranks, specials, ids=ids, eos_token=eos_token)

    @classmethod
    def from_folder(cls, folder: Path) -> GPT2Tokenizer | None:
        """The tokenizer a model folder ships, or None if it ships none."""
        for vocab_name, merges_name in (("vocab.json", "merges.txt"),
                                        ("encoder.json", "vocab.bpe")):
            vocab_path, merges_path = folder / vocab_name, folder / merges_name
            if vocab_path.exists() and merges_path.exists():
                vocab = _read_json(_inside(folder, vocab_name))
                merges = _read_merges(_inside(folder, merges_name))
                if not _token_ids(vocab):
                    raise ModelLoadError(f"{vocab_path}: not a map of token to integer id "
                                         f"in [0, {MAX_TOKEN_ID}]")
                return cls.from_vocab_merges(vocab, merges, vocab_path)
        fast = folder / "tokenizer.json"
        if fast.exists():
            spec = _read_json(_inside(folder, "tokenizer.json"))
            try:
                return cls._from_fast_spec(spec, fast)
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                if isinstance(exc, ModelLoadError):
                    raise
                raise ModelLoadError(f"{fast}: not a BPE tokenizer.json of the expected shape "
                                     f"({type(exc).__name__})") from None
        return None

    @classmethod
    def _from_fast_spec(cls, spec: dict, fast: Path) -> GPT2Tokenizer:
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            kind = model.get("type") if isinstance(model.get("type"), str) else None
            raise ModelLoadError(f"{fast}: model type {str(kind)[:40]!r} is not BPE")
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
                  for m in model.get("merges", [])]
        if any(len(m) != 2 for m in merges):
            raise ModelLoadError(f"{fast}: a merge is not a pair of tokens")
        vocab = dict(model.get("vocab", {}))
        for added in spec.get("added_tokens", []):
            vocab.setdefault(added["content"], added["id"])
        if not _token_ids(vocab):
            raise ModelLoadError(f"{fast}: the vocabulary is not a map of token to integer id "
                                 f"in [0, {MAX_TOKEN_ID}]")
        return cls.from_vocab_merges(vocab, merges, fast)

    @classmethod
    def for_model(cls, folder: Path | None) -> GPT2Tokenizer:
        """A model folder's own tokenizer files if it has any, else GPT-2's."""
        own = cls.from_folder(folder) if folder is not None else None
        return own if own is not None else cls.default()

    # ---- the Tokenizer protocol -------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        check_text(text)
        if allow_special:
            ranks = self._encoding.encode(text, allowed_special="all")
        else:
            ranks = self._encoding.encode_ordinary(text)
        if self._rank_to_id is None:
            return ranks
        return self._rank_to_id[np.asarray(ranks, dtype=np.int64)].tolist()

    def _ranks(self, ids: Sequence[int]) -> list[int]:
        if self._id_to_rank is None:
            return [int(i) for i in ids]
        try:
            return [self._id_to_rank[int(i)] for i in ids]
        except KeyError as exc:
            raise InvalidArgumentError(f"token id {exc.args[0]} is not in the vocabulary") from None

    bytes_concatenate = True

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The exact bytes of the tokens (a token may end inside a UTF-8 character)."""
        ranks = self._ranks(ids)
        limit = self._encoding.max_token_value
        bad = [i for i, r in zip(ids, ranks, strict=True) if not 0 <= r <= limit]
        if bad:
            raise InvalidArgumentError(f"token id {bad[0]} is not in the vocabulary")
        return self._encoding.decode_bytes(ranks)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True, tokenize: bool = False,
                            **kwargs: Any) -> str | list[int]:
        """GPT-2's files carry no chat template: an error saying so."""
        from orion.tokenizers.chat_template import ChatTemplateError

        raise ChatTemplateError(f"the {self._encoding.name} tokenizer has no chat template")

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the tokens; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _inside(folder: Path, name: str) -> Path:
    try:
        return inside(folder, name)
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None


def _token_ids(vocab: Mapping[object, object]) -> bool:
    """Whether a vocabulary maps strings to ids in [0, MAX_TOKEN_ID]."""
    return all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
               and 0 <= v <= MAX_TOKEN_ID for k, v in vocab.items())


def _is_special(token: str) -> bool:
    return token.startswith("<|") and token.endswith("|>")


def _read_json(path: Path) -> dict:
    try:
        data = read_json_file(path, max_bytes=MAX_JSON_BYTES)
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def _read_merges(path: Path) -> list[tuple[str, str]]:
    try:
        text = read_bytes(path, max_bytes=MAX_TOKENIZER_BYTES).decode("utf-8")
    except UnsafeFileError as exc:
        raise ModelLoadError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    lines = text.split("\n")
    merges = []
    for lineno, line in enumerate(lines, 1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            # the line is not echoed: a file that is not a merges file may be anything
            raise ModelLoadError(f"{path}:{lineno}: a merge is two tokens separated by a "
                                 f"space, this line has {len(parts)} parts")
        merges.append((parts[0], parts[1]))
    return merges
