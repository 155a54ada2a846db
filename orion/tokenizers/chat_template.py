"""Chat templates: a model folder's Jinja template, rendered as transformers'
`apply_chat_template` renders it, so the prompt a chat model sees is the one it was
trained on.

The template comes from the folder (`find_template`): `chat_template.jinja`, else
`chat_template` in `tokenizer_config.json` (a string, or a list of named templates of
which "default" is used). It runs in jinja2's `ImmutableSandboxedEnvironment` with
transformers' settings and globals (trim_blocks, lstrip_blocks, loopcontrols,
`raise_exception`, `strftime_now`, a `tojson` filter that does not HTML-escape, the
`dict` and `namespace` helpers), and sees `messages`, `add_generation_prompt` and the
tokenizer's named special tokens (`bos_token`, `eos_token`, ...). A template is code
from the folder: the sandbox keeps it from reaching Python internals, and any failure
to compile or render is a `ChatTemplateError` naming where the template came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import MAX_JSON_BYTES, inside, read_text

TEMPLATE_FILE = "chat_template.jinja"


class ChatTemplateError(ModelLoadError):
    """A chat template that is missing, does not compile, or fails to render."""


# ---- the environment transformers renders in ------------------------------------


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' override: jinja's own tojson HTML-escapes, which templates do not want
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's `namespace`, refusing underscore names (a way towards Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not store underscore names on a namespace ({name!r})")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker):
    rendered as its body; Orion does not compute assistant masks."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


# ---- inputs the template sees --------------------------------------------------


def _plain(value: Any) -> Any:
    """Plain JSON types only (as transformers does): the sandbox should not meet
    objects whose methods it does not know to be harmless."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("messages must be a list of {'role': ..., 'content': ...} "
                                   "objects")
    if not messages:
        raise InvalidArgumentError("a chat needs at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidArgumentError(f"message {i} is not an object with 'role' and 'content'")
        # keys whose value is None are dropped, as transformers does (OpenAI's content=None)
        plain = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_FIELDS if plain.get(k) is not None), None)
        if reasoning is not None:  # transformers' aliases of a message's reasoning
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


# ---- the template --------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, *, origin: str,
                 special_tokens: Mapping[str, str] | None = None) -> None:
        self.source, self.origin = source, origin
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{origin}: the chat template does not compile: "
                                    f"{_describe(exc)}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text for `messages`. Extra keyword arguments reach the template
        as variables (as in transformers), overriding the special tokens."""
        chat = _messages(messages)
        variables = {**self.special_tokens, **_plain(kwargs)}
        try:
            return self._template.render(messages=chat, tools=None, documents=None,
                                         add_generation_prompt=bool(add_generation_prompt),
                                         **variables)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.origin}: the chat template failed: "
                                    f"{_describe(exc)}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError,
                ZeroDivisionError, OverflowError, RecursionError) as exc:
            # a template is a program: its bugs surface as Python errors inside jinja
            raise ChatTemplateError(f"{self.origin}: the chat template failed: "
                                    f"{type(exc).__name__}: {exc}") from None


def _describe(exc: jinja2.exceptions.TemplateError) -> str:
    line = getattr(exc, "lineno", None)
    where = f" (line {line})" if line else ""
    return f"{exc.message or type(exc).__name__}{where}"


def find_template(folder: Path, tokenizer_config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(template source, where it came from) for a model folder, or None if it has none."""
    jinja_file = folder / TEMPLATE_FILE
    if jinja_file.exists() or jinja_file.is_symlink():
        try:
            text = read_text(inside(folder, TEMPLATE_FILE), max_bytes=MAX_JSON_BYTES)
        except (OSError, ValueError) as exc:   # orion.files' UnsafeFileError is a ValueError
            raise ChatTemplateError(str(exc)) from None
        return text, str(jinja_file)
    origin = f"{folder / 'tokenizer_config.json'}: chat_template"
    template = tokenizer_config.get("chat_template")
    if template is None:
        return None
    if isinstance(template, str):
        return template, origin
    if isinstance(template, list):
        named = {}
        for entry in template:
            if not (isinstance(entry, Mapping) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise ChatTemplateError(f"{origin}: a list of templates must hold "
                                        "{'name': ..., 'template': ...} objects")
            named[entry["name"]] = entry["template"]
        if "default" in named:
            return named["default"], f"{origin} 'default'"
        if len(named) == 1:
            (name, text), = named.items()
            return text, f"{origin} {name!r}"
        raise ChatTemplateError(f"{origin}: {len(named)} named templates and none is "
                                f"'default' ({', '.join(sorted(named))})")
    raise ChatTemplateError(f"{origin}: expected a string or a list of named templates")
