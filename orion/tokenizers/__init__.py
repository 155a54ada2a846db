"""`load_tokenizer(folder)`: the tokenizer a model folder ships, by what is on disk.

    tokenizer.json                  Hugging Face `tokenizers` (orion.tokenizers.hf)
    tokenizer.model                 SentencePiece (orion.tokenizers.sentencepiece)
    vocab.json + merges.txt,
    encoder.json + vocab.bpe        GPT-2's byte-level BPE on tiktoken
                                    (orion.tokenizers.gpt2)

tokenizer.json comes first: it is what transformers itself loads when a folder has
several (TinyLlama ships tokenizer.model beside it). A SentencePiece folder also gets
its tokenizer_config.json chat template and generation_config.json end tokens.
Every file is opened through `orion.files` (inside the folder, bounded), and every
malformed file is a `ModelLoadError` naming it.
"""

from __future__ import annotations

from pathlib import Path

from orion.errors import ModelLoadError
from orion.tokenizers.base import Tokenizer


def _exists(folder: Path, name: str) -> bool:
    return (folder / name).exists() or (folder / name).is_symlink()


def load_tokenizer(folder: str | Path) -> Tokenizer | None:
    """The tokenizer in `folder` (see the module docstring), or None if it has none."""
    folder = Path(folder)
    if _exists(folder, "tokenizer.json"):
        from orion.tokenizers.hf import HFTokenizer

        return HFTokenizer.from_folder(folder)
    if _exists(folder, "tokenizer.model"):
        return _sentencepiece(folder)
    from orion.tokenizers.gpt2 import GPT2Tokenizer

    return GPT2Tokenizer.from_folder(folder)


def _sentencepiece(folder: Path) -> Tokenizer:
    from orion.files import MAX_TOKENIZER_BYTES, check_regular, inside
    from orion.tokenizers.chat_template import ChatTemplate, find_template
    from orion.tokenizers.hf import (
        CONFIG_FILE,
        GENERATION_FILE,
        NAMED_SPECIAL,
        read_optional_json,
        token_text,
    )
    from orion.tokenizers.sentencepiece import SentencePieceTokenizer

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
