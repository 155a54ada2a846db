"""`load_tokenizer(folder)`: the tokenizer a model folder ships, by what is on disk.

    tokenizer.json                  Hugging Face `tokenizers` (orion.models.tokenizer_hf)
    tokenizer.model                 SentencePiece (orion.models.tokenizer_sp)
    vocab.json + merges.txt,
    encoder.json + vocab.bpe        GPT-2's byte-level BPE on tiktoken
                                    (orion.models.tokenizer_gpt2)

tokenizer.json comes first: it is what transformers itself loads when a folder has
several (TinyLlama ships tokenizer.model beside it). A SentencePiece folder also gets
its tokenizer_config.json chat template and generation_config.json end tokens.
Every file is opened through `orion.files` (inside the folder, bounded), and every
malformed file is a `ModelLoadError` naming it.
"""

from __future__ import annotations

from pathlib import Path

from orion.errors import OrionError
from orion.models.base import ModelLoadError, Tokenizer


class PromptTextError(OrionError, ValueError):
    """Text that is not valid Unicode (a lone surrogate) cannot be tokenized."""


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


def _exists(folder: Path, name: str) -> bool:
    return (folder / name).exists() or (folder / name).is_symlink()


def load_tokenizer(folder: str | Path) -> Tokenizer | None:
    """The tokenizer in `folder` (see the module docstring), or None if it has none."""
    folder = Path(folder)
    if _exists(folder, "tokenizer.json"):
        from orion.models.tokenizer_hf import HFTokenizer

        return HFTokenizer.from_folder(folder)
    if _exists(folder, "tokenizer.model"):
        return _sentencepiece(folder)
    from orion.models.tokenizer_gpt2 import GPT2Tokenizer

    return GPT2Tokenizer.from_folder(folder)


def _sentencepiece(folder: Path) -> Tokenizer:
    from orion.files import MAX_TOKENIZER_BYTES, check_regular, inside
    from orion.models.chat_template import ChatTemplate, find_template
    from orion.models.tokenizer_hf import (
        CONFIG_FILE,
        GENERATION_FILE,
        NAMED_SPECIAL,
        read_optional_json,
        token_text,
    )
    from orion.models.tokenizer_sp import SentencePieceTokenizer

    try:
        path = check_regular(inside(folder, "tokenizer.model"), max_bytes=MAX_TOKENIZER_BYTES)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(str(exc)) from None
    tok = SentencePieceTokenizer(path)
    config = read_optional_json(folder, CONFIG_FILE)
    generation = read_optional_json(folder, GENERATION_FILE)
    extra = generation.get("eos_token_id")
    extra = extra if isinstance(extra, list) else [extra]
    ids = [tok.eos_token_id, *(i for i in extra if isinstance(i, int) and 0 <= i < tok.vocab_size)]
    tok.eos_token_ids = tuple(dict.fromkeys(i for i in ids if i is not None))
    found = find_template(folder, config)
    if found is not None:
        specials = {"bos_token": tok.sp.id_to_piece(tok.bos_token_id or 0),
                    "eos_token": tok.sp.id_to_piece(tok.eos_token_id or 0)}
        for name in NAMED_SPECIAL:
            text = token_text(config.get(name), f"{folder / CONFIG_FILE}: {name}")
            if text is not None:
                specials[name] = text
        tok.chat_template = ChatTemplate(found[0], origin=found[1], special_tokens=specials)
    return tok
