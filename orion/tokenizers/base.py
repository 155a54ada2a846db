"""What every tokenizer offers (`Tokenizer`), and the check every encoder makes on its
text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from orion.errors import OrionError


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids. `decode_bytes` is optional (see `orion.generate`): a
    tokenizer that has it lets streaming cut exactly at UTF-8 boundaries. So are
    `eos_token_ids` (every end token; generation stops on any) and
    `apply_chat_template` (orion.tokenizers has the tokenizers that have them)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class PromptTextError(OrionError, ValueError):
    """Text that is not valid Unicode (a lone surrogate) cannot be tokenized."""


class TokenizerError(OrionError, ValueError):
    """A tokenizer failed on a text or on ids (a regex in tokenizer.json that gives up
    on some input); the message names the tokenizer's file."""


def check_text(text: str) -> None:
    """Refuses a str that cannot be UTF-8 (lone surrogates, e.g. from bytes decoded
    with `surrogateescape`), naming the offset of the first bad character."""
    if not isinstance(text, str):
        raise TypeError(f"text to encode must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptTextError(f"the text is not valid UTF-8: a lone surrogate at "
                              f"character {exc.start}") from None
