"""A model folder's `tokenizer.json` through Hugging Face's `tokenizers` library, with
the settings transformers takes from the files beside it.

    tokenizer.json          the tokenizer itself (BPE, Unigram, WordPiece; added tokens)
    tokenizer_config.json   special tokens (bos/eos/pad/unk...), add_bos_token /
                            add_eos_token, the chat template (optional file)
    generation_config.json  eos_token_id (an int or a list: Llama 3 ends a turn with
                            <|eot_id|> or <|eom_id|>, a text with <|end_of_text|>) and
                            sampling defaults (optional file)

`encode(text)` gives the ids transformers' `tokenizer(text)["input_ids"]` gives.
The post-processor in tokenizer.json decides which special tokens `encode` adds (as
in transformers 5, which ignores `add_bos_token` beside one); a tokenizer.json with no
post-processor gets one from `add_bos_token` / `add_eos_token` (transformers 4's rule;
transformers 5.24 adds nothing there, which would silently drop a Llama-2 BOS).
`eos_token_ids` holds every end token; generation stops on any of them.

Settings in tokenizer.json that would change ids behind the caller's back are turned
off, with a warning naming them, as transformers' `tokenizer(text)` leaves them off
unless asked: `truncation` (a prompt is never cut), `padding`, and BPE `dropout`
(random merges: the same text would give other ids each time). A failure inside the
tokenizers library (a Split regex that gives up on some text raises its Rust panic,
a BaseException) is a `TokenizerError`. generation_config.json's sampling defaults are
checked at load: a NaN or negative temperature is a ModelLoadError there, not a failure
of every request that uses the default.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _Backend
from tokenizers import normalizers, processors

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import MAX_JSON_BYTES, inside, read_json, read_text
from orion.tokenizers.backend import backend_from_document
from orion.tokenizers.base import TokenizerError, check_text
from orion.tokenizers.chat_template import ChatTemplate, find_template
from orion.tokenizers.gpt2 import byte_decoder

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
GENERATION_FILE = "generation_config.json"
# the named special tokens transformers passes to chat templates (its special_tokens_map)
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                 "cls_token", "mask_token")
# tokenizer classes whose transformers implementation adds an NFC normalizer
NFC_CLASSES = ("Qwen2Tokenizer",)
# generation_config.json fields Orion's sampler understands
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens",
                       "do_sample")
log = logging.getLogger("orion.tokenizers")


def check_generation_defaults(generation: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The sampling defaults of generation_config.json (fields absent or null are left
    out), each checked for type and range; anything else is a ModelLoadError."""
    out: dict[str, Any] = {}
    for name in GENERATION_DEFAULTS:
        value = generation.get(name)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        integer = isinstance(value, int) and not isinstance(value, bool)
        ok = {"temperature": number and math.isfinite(value) and value >= 0,
              "top_p": number and 0 < value <= 1,
              "top_k": integer and value >= 0,
              "repetition_penalty": number and math.isfinite(value) and value > 0,
              "max_new_tokens": integer and value >= 0,
              "do_sample": isinstance(value, bool)}[name]
        if not ok:
            want = {"temperature": "a finite number >= 0", "top_p": "a number in (0, 1]",
                    "top_k": "an integer >= 0", "repetition_penalty": "a finite number > 0",
                    "max_new_tokens": "an integer >= 0", "do_sample": "true or false"}[name]
            raise ModelLoadError(f"{where}: {name} must be {want}, got {value!r}"[:300])
        out[name] = value
    return out


def read_optional_json(folder: Path, name: str) -> dict[str, Any]:
    """A folder's JSON object file, {} when the folder has no such file. Any failure is
    a ModelLoadError naming the file."""
    if not (folder / name).exists() and not (folder / name).is_symlink():
        return {}
    try:
        data = read_json(inside(folder, name))
    except (OSError, ValueError) as exc:  # UnsafeFileError is a ValueError
        raise ModelLoadError(str(exc)) from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{folder / name}: expected a JSON object")
    return data


def token_text(value: Any, where: str) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, or an AddedToken
    object {"content": ...}."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ModelLoadError(f"{where}: expected a token string or {{'content': ...}}")


def _id_list(value: Any, where: str) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ModelLoadError(f"{where}: expected a token id or a list of token ids")
    return list(values)


def _json_document(text: str) -> Any:
    """tokenizer.json parsed by Python, or None where Python's parser refuses it (the
    library's reader then names what is wrong)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


class HFTokenizer:
    """The Tokenizer protocol over a `tokenizers.Tokenizer` (see the module docstring)."""

    def __init__(self, backend: _Backend, *, config: Mapping[str, Any] | None = None,
                 generation: Mapping[str, Any] | None = None, source: str = "",
                 identity: str = "", chat_template: ChatTemplate | None = None) -> None:
        config, generation = dict(config or {}), dict(generation or {})
        self.source = source or "tokenizer.json"
        self.identity = identity or "hf-" + hashlib.sha256(
            backend.to_str().encode()).hexdigest()[:16]
        self._tok = backend
        cfg_name = f"{Path(self.source).parent / CONFIG_FILE}"
        self.special_tokens: dict[str, str] = {}
        for name in NAMED_SPECIAL:
            text = token_text(config.get(name), f"{cfg_name}: {name}")
            if text is not None:
                self.special_tokens[name] = text
        self.bos_token_id = self._special_id("bos_token", cfg_name)
        first_eos = self._special_id("eos_token", cfg_name)
        gen_name = f"{Path(self.source).parent / GENERATION_FILE}"
        ids = [first_eos] if first_eos is not None else []
        if "eos_token_id" in generation and generation["eos_token_id"] is not None:
            ids += _id_list(generation["eos_token_id"], f"{gen_name}: eos_token_id")
        if any(i >= self.vocab_size for i in ids):
            raise ModelLoadError(f"{gen_name}: eos_token_id {max(ids)} is past the "
                                 f"{self.vocab_size} tokens of {self.source}")
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        if self.bos_token_id is None and isinstance(generation.get("bos_token_id"), int):
            self.bos_token_id = int(generation["bos_token_id"])
        self.generation_defaults = check_generation_defaults(generation, gen_name)
        self._turn_off_hidden_settings()
        self._apply_bos_eos(config)
        self._apply_class_normalizer(config)
        self.chat_template = chat_template
        self._added = {int(i): t.content for i, t in backend.get_added_tokens_decoder().items()}
        # byte-level BPE has exact bytes per token: streaming cuts at UTF-8 boundaries
        # in O(1) a token instead of re-decoding the whole text
        self.bytes_concatenate = type(backend.decoder).__name__ == "ByteLevel"

    def _special_id(self, name: str, where: str) -> int | None:
        text = self.special_tokens.get(name)
        if text is None:
            return None
        i = self._tok.token_to_id(text)
        if i is None:
            raise ModelLoadError(f"{where}: {name} {text!r} is not in {self.source}")
        return int(i)

    def _turn_off_hidden_settings(self) -> None:
        """tokenizer.json's truncation, padding and BPE dropout, off (module docstring)."""
        off = []
        if self._tok.truncation is not None:
            off.append(f"truncation (max_length {self._tok.truncation.get('max_length')})")
            self._tok.no_truncation()
        if self._tok.padding is not None:
            off.append("padding")
            self._tok.no_padding()
        if getattr(self._tok.model, "dropout", None):
            off.append(f"BPE dropout {self._tok.model.dropout:.3g}")
            self._tok.model.dropout = None
        if off:
            log.warning("%s: %s turned off: Orion never cuts, pads or randomizes a "
                        "tokenization", self.source, ", ".join(off))

    def _guarded(self, call: Callable[[], Any]) -> Any:
        """The library's call, its Rust panic (a BaseException) as a TokenizerError."""
        try:
            return call()
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            reason = (str(exc).splitlines() or [""])[0][:200]
            raise TokenizerError(f"{self.source}: the tokenizers library failed on this "
                                 f"text ({reason or 'a panic'})") from None

    def _apply_bos_eos(self, config: Mapping[str, Any]) -> None:
        """No post-processor in tokenizer.json: one that adds what add_bos_token /
        add_eos_token ask for (see the module docstring)."""
        if self._tok.post_processor is not None:
            return
        add_bos = bool(config.get("add_bos_token")) and self.bos_token_id is not None
        add_eos = bool(config.get("add_eos_token")) and "eos_token" in self.special_tokens
        bos, eos = self.special_tokens.get("bos_token"), self.special_tokens.get("eos_token")
        single = (f"{bos}:0 " if add_bos else "") + "$A:0" + (f" {eos}:0" if add_eos else "")
        pair = (single + (f" {bos}:1" if add_bos else "") + " $B:1"
                + (f" {eos}:1" if add_eos else ""))
        specials = []
        if add_bos:
            specials.append((bos, self.bos_token_id))
        if add_eos:
            specials.append((eos, self._special_id("eos_token", self.source)))
        self._tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=specials)

    def _apply_class_normalizer(self, config: Mapping[str, Any]) -> None:
        """transformers' Qwen2Tokenizer normalizes to NFC whatever tokenizer.json says
        (Qwen's original tokenizer did); some saved files lack the normalizer."""
        cls = str(config.get("tokenizer_class") or "").removesuffix("Fast")
        if cls in NFC_CLASSES and self._tok.normalizer is None:
            self._tok.normalizer = normalizers.NFC()

    # ---- constructors -------------------------------------------------------------

    @classmethod
    def from_folder(cls, folder: str | Path) -> HFTokenizer:
        """The tokenizer of a model folder holding tokenizer.json."""
        folder = Path(folder)
        path = folder / TOKENIZER_FILE
        try:
            text = read_text(inside(folder, TOKENIZER_FILE), max_bytes=MAX_JSON_BYTES)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(str(exc)) from None
        try:
            backend = backend_from_document(_json_document(text), text)
        except BaseException as exc:  # noqa: BLE001 - plain Exception, or a Rust panic
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise ModelLoadError(f"{path}: not a tokenizer the tokenizers library can "
                                 f"read ({reason})") from None
        config = read_optional_json(folder, CONFIG_FILE)
        generation = read_optional_json(folder, GENERATION_FILE)
        tok = cls(backend, config=config, generation=generation, source=str(path),
                  identity="hf-" + hashlib.sha256(text.encode()).hexdigest()[:16])
        found = find_template(folder, config)
        if found is not None:
            tok.chat_template = ChatTemplate(found[0], origin=found[1],
                                             special_tokens=tok.special_tokens)
        return tok

    # ---- the Tokenizer protocol ---------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`; special tokens written in the text become their ids."""
        check_text(text)
        encoding = self._guarded(lambda: self._tok.encode(
            text, add_special_tokens=add_special_tokens))
        return list(encoding.ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise InvalidArgumentError(f"token id {bad[0]} is not in the vocabulary of "
                                       f"{self.source}")
        return str(self._guarded(lambda: self._tok.decode(
            ids, skip_special_tokens=skip_special_tokens)))

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Byte-level BPE: the bytes of the tokens (GPT-2's alphabet), added tokens as
        their text, as the ByteLevel decoder gives them. Other decoders: the UTF-8 of
        `decode` (a token's bytes depend on its neighbours there)."""
        if not self.bytes_concatenate:
            return self.decode(ids).encode("utf-8")
        table = byte_decoder()
        out = bytearray()
        for i in ids:
            i = int(i)
            added = self._added.get(i)
            if added is not None:
                out += added.encode("utf-8")
                continue
            token = self._tok.id_to_token(i)
            if token is None:
                raise InvalidArgumentError(f"token id {i} is not in the vocabulary of "
                                           f"{self.source}")
            try:
                out += bytes(table[ch] for ch in token)
            except KeyError:
                out += token.encode("utf-8")   # not in the byte alphabet: as the decoder does
        return bytes(out)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    # ---- chat ---------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True, tokenize: bool = False,
                            **kwargs: Any) -> str | list[int]:
        """The folder's chat template over `messages`: text, or ids when `tokenize`
        (encoded without adding special tokens, as transformers does)."""
        from orion.tokenizers.chat_template import ChatTemplateError

        if self.chat_template is None:
            raise ChatTemplateError(f"{Path(self.source).parent}: the folder has no chat "
                                    "template (chat_template.jinja or tokenizer_config.json)")
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                         **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text
