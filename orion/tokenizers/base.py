"""What every tokenizer offers (`Tokenizer`), and the check every encoder makes on its
text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from orion.errors import InvalidArgumentError, OrionError

if TYPE_CHECKING:
    from orion.tokenizers.chat_template import ChatTemplate


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids, and what a generation needs of the model's vocabulary.

    vocab_size:          ids are 0 .. vocab_size - 1
    eos_token_id:        the end-of-text token (None: it has none)
    eos_token_ids:       every token that ends a generation (Llama 3 has several)
    identity:            a short hash of the vocabulary (a run's data files carry it)
    chat_template:       the folder's chat template, or None
    generation_defaults: sampling defaults from generation_config.json ({} when none)
    decode_bytes:        the raw bytes of ids
    bytes_concatenate:   decode_bytes(a + b) == decode_bytes(a) + decode_bytes(b), so a
                         stream can decode one token at a time and cut at UTF-8
                         boundaries (byte-level BPE, SentencePiece pieces)
    apply_chat_template: `chat_template` over messages, as text or ids; an error
                         naming the folder when it has no template
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def identity(self) -> str: ...

    @property
    def chat_template(self) -> ChatTemplate | None: ...

    @property
    def generation_defaults(self) -> Mapping[str, Any]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def decode_bytes(self, ids: Sequence[int]) -> bytes: ...

    @property
    def bytes_concatenate(self) -> bool: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True, tokenize: bool = False,
                            **kwargs: Any) -> str | list[int]: ...


class PromptTextError(OrionError, ValueError):
    """Text that is not valid Unicode (a lone surrogate) cannot be tokenized."""


class TokenizerError(OrionError, ValueError):
    """A tokenizer failed on a text or on ids (a regex in tokenizer.json that gives up
    on some input); the message names the tokenizer's file."""


def check_text(text: str) -> None:
    """Refuses a str that cannot be UTF-8 (lone surrogates, e.g. from bytes decoded
    with `surrogateescape`), naming the offset of the first bad character."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text to encode must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptTextError(f"the text is not valid UTF-8: a lone surrogate at "
                              f"character {exc.start}") from None
