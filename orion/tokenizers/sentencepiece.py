"""SentencePiece tokenizers: Meta's Llama-2 model, and small vocabularies trained on a
corpus (llama2.c's `train_vocab`: BPE, byte fallback, digits split, identity
normalization), both through the `sentencepiece` package."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sentencepiece as spm

from orion.errors import DataError, ModelLoadError
from orion.files import MAX_TOKENIZER_BYTES, UnsafeFileError, check_regular, read_bytes
from orion.tokenizers.base import check_text

if TYPE_CHECKING:
    from orion.tokenizers.chat_template import ChatTemplate

# corpora too small to train a vocabulary on fail inside sentencepiece; refuse them first
MIN_CORPUS_BYTES = 64


class SentencePieceTokenizer:
    """The Tokenizer protocol over a SentencePiece model file (a regular file of
    bounded size; a corrupt one is a ModelLoadError naming it)."""

    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        self.path = Path(model_file)
        try:
            data = read_bytes(self.path, max_bytes=MAX_TOKENIZER_BYTES)
        except UnsafeFileError as exc:
            raise ModelLoadError(f"tokenizer {exc}") from None
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(data)
        except (RuntimeError, OSError, ValueError):
            raise ModelLoadError(f"{self.path}: not a SentencePiece model (it does not "
                                 "parse)") from None
        if self.sp.vocab_size() <= 0:
            raise ModelLoadError(f"{self.path}: a SentencePiece model with no pieces")
        self.identity = "sp-" + hashlib.sha256(data).hexdigest()[:16]
        # set by orion.tokenizers.load_tokenizer from the folder's other files
        self.chat_template: ChatTemplate | None = None
        self.generation_defaults: dict[str, Any] = {}
        eos = self.eos_token_id
        self.eos_token_ids: tuple[int, ...] = () if eos is None else (eos,)

    def __repr__(self) -> str:
        return (f"<SentencePieceTokenizer {self.path.name} ({self.identity}): "
                f"{self.vocab_size} pieces, bos {self.bos_token_id}, eos {self.eos_token_id}>")

    @property
    def vocab_size(self) -> int:
        return int(self.sp.vocab_size())

    @property
    def bos_token_id(self) -> int | None:
        i = int(self.sp.bos_id())
        return i if i >= 0 else None

    @property
    def eos_token_id(self) -> int | None:
        i = int(self.sp.eos_id())
        return i if i >= 0 else None

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        check_text(text)
        ids = list(self.sp.encode(text))
        if bos and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        if eos and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.sp.decode([int(i) for i in ids]))

    bytes_concatenate = True

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The UTF-8 bytes of the pieces, byte-fallback tokens as their byte, so a
        stream can cut at character boundaries."""
        out = bytearray()
        for i in ids:
            i = int(i)
            if self.sp.is_byte(i):
                out.append(int(self.sp.id_to_piece(i)[3:5], 16))
            elif self.sp.is_control(i) or self.sp.is_unknown(i):
                continue
            else:
                out += self.sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8")
        return bytes(out)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True, tokenize: bool = False,
                            **kwargs: Any) -> str | list[int]:
        """The folder's chat template over `messages` (text, or ids when `tokenize`)."""
        from orion.tokenizers.chat_template import ChatTemplateError

        if self.chat_template is None:
            raise ChatTemplateError(f"{self.path.parent}: the folder has no chat template "
                                    "(chat_template.jinja or tokenizer_config.json)")
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                         **kwargs)
        return self.encode(text) if tokenize else text

    def pieces(self) -> list[tuple[bytes, float]]:
        """(piece bytes, score) for llama2.c's tokenizer.bin, as its tokenizer.py makes
        them: "▁" as a space, <s> / </s> spelled out."""
        out = []
        for i in range(self.vocab_size):
            p = self.sp.id_to_piece(i)
            if i == self.bos_token_id:
                p = "\n<s>\n"
            elif i == self.eos_token_id:
                p = "\n</s>\n"
            out.append((p.replace("\u2581", " ").encode("utf-8"), float(self.sp.get_score(i))))
        return out


def train_sentencepiece(text_path: str | os.PathLike[str], vocab_size: int,
                        out_model: str | os.PathLike[str], max_sentences: int = 200000,
                        seed_text_bytes: int = 0) -> SentencePieceTokenizer:
    """Trains a BPE vocabulary on a text file with llama2.c's settings and writes the
    .model file. Deterministic for a given corpus and vocab size."""
    out_model = Path(out_model)
    try:
        size = check_regular(text_path).stat().st_size   # sentencepiece opens it by name
    except UnsafeFileError as exc:
        raise DataError(f"training data {exc}") from None
    if size < MIN_CORPUS_BYTES:
        raise DataError(f"training data {text_path}: {size} bytes, too little text to train "
                        f"a vocabulary of {vocab_size}")
    out_model.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "sp")
        try:
            _train(text_path, prefix, vocab_size, max_sentences)
        except RuntimeError as exc:   # sentencepiece's only error type; its text is its own
            raise DataError(f"training data {text_path}: cannot train a vocabulary of "
                            f"{vocab_size} on it ({_first_line(exc)})") from None
        data = Path(prefix + ".model").read_bytes()
    from orion.atomic import atomic_write_bytes

    atomic_write_bytes(out_model, data)
    return SentencePieceTokenizer(out_model)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1][:200] if lines else type(exc).__name__


def _train(text_path: str | os.PathLike[str], prefix: str, vocab_size: int,
           max_sentences: int) -> None:
    spm.SentencePieceTrainer.train(
        input=os.fspath(text_path), model_prefix=prefix, model_type="bpe",
        vocab_size=vocab_size, input_format="text",
        character_coverage=1.0, num_threads=1, split_digits=True,
        allow_whitespace_only_pieces=True, byte_fallback=True, unk_surface=r" \342\201\207 ",
        normalization_rule_name="identity", input_sentence_size=max_sentences,
        shuffle_input_sentence=False, minloglevel=2,
    )
