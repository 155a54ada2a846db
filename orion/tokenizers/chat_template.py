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

A template is also bounded, so that no folder can hang or exhaust a process (or hold
a server's thread) by its template:
- nesting (blocks, brackets) is at most `MAX_NESTING` deep, checked at load with
  jinja's own lexer, before the parser recurses;
- a render stops after `RENDER_SECONDS` (orion.time_budget), and once its output
  passes `MAX_RENDER_CHARS` characters;
- one operation cannot build a value past that size either (`'x' * 10**9`, `10**10**9`,
  `center(10**9)`, a namespace string grown without end), since the time budget stops
  Python loops, not one long C call; running out of memory anyway is an error too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orion.errors import InvalidArgumentError, ModelLoadError
from orion.files import MAX_JSON_BYTES, inside, read_text
from orion.time_budget import BudgetExceeded, within

TEMPLATE_FILE = "chat_template.jinja"
RENDER_SECONDS = 2.0             # real templates render in milliseconds
MAX_RENDER_CHARS = 16 << 20      # 4x the largest request body a server takes
MAX_NESTING = 64                 # real templates nest under 10 deep
MAX_INT_BITS = 1 << 16           # integers a template computes (10**19728 at most)


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
        _check_size(value)
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


# ---- bounds on what one operation may build --------------------------------------


def _too_big(what: str) -> jinja2.exceptions.SecurityError:
    return jinja2.exceptions.SecurityError(
        f"{what} would pass the {MAX_RENDER_CHARS} characters (or items) a chat template "
        "may build")


def _check_size(value: Any) -> None:
    if isinstance(value, str | list | tuple | dict) and len(value) > MAX_RENDER_CHARS:
        raise _too_big("a value")


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _checked_binop(op: str, left: Any, right: Any) -> None:
    """Refuses `*`, `**` and `+` whose result would be huge, before computing it."""
    sized = (str, list, tuple)
    if op == "**" and _int(left) and _int(right) and right > 0 \
            and max(abs(left).bit_length(), 1) * right > MAX_INT_BITS and abs(left) > 1:
        raise _too_big(f"an integer power ({left.bit_length()} bits ** {right})")
    if op == "*":
        if _int(left) and _int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _too_big("an integer product")
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, sized) and _int(n) and len(seq) * n > MAX_RENDER_CHARS:
                raise _too_big(f"a repetition ({len(seq)} x {n})")
    if op == "+" and isinstance(left, sized) and isinstance(right, sized) \
            and len(left) + len(right) > MAX_RENDER_CHARS:
        raise _too_big("a concatenation")


def _checked_width(width: Any) -> None:
    if _int(width) and width > MAX_RENDER_CHARS:
        raise _too_big(f"a width of {width}")


# str methods that can build a string far larger than their inputs
_WIDENING = {"center", "ljust", "rjust", "zfill"}


def _checked_call(obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    if name in _WIDENING and args:
        _checked_width(args[0])
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if _int(size) and owner.count("\t") * size > MAX_RENDER_CHARS:
            raise _too_big("expandtabs")
    elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        old, new = args[0], args[1]
        hits = len(owner) + 1 if not old else owner.count(old)
        if len(owner) + hits * max(len(new) - len(old), 0) > MAX_RENDER_CHARS:
            raise _too_big("a replace")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with `*`, `**`, `+` and widening calls checked first (see above)."""

    intercepted_binops = frozenset({"*", "**", "+"})

    def call_binop(self, context: jinja2.runtime.Context, op: str, left: Any,
                   right: Any) -> Any:
        _checked_binop(op, left, right)
        return self.binop_table[op](left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any,
             *args: Any, **kwargs: Any) -> Any:
        _checked_call(__obj, args, kwargs)
        return ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)


def _center(value: Any, width: int = 80) -> str:
    _checked_width(width)
    return jinja2.filters.do_center(value, width)


def _indent(s: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    lines = str(s).count("\n") + 1
    if _int(width) and width * lines > MAX_RENDER_CHARS \
            or isinstance(width, str) and len(width) * lines > MAX_RENDER_CHARS:
        raise _too_big("an indent")
    return jinja2.filters.do_indent(s, width, first, blank)


@jinja2.pass_eval_context
def _replace(eval_ctx: jinja2.nodes.EvalContext, s: str, old: str, new: str,
             count: int | None = None) -> str:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        _checked_call(s.replace, (old, new), {})
    return jinja2.filters.do_replace(eval_ctx, s, old, new, count)


def _check_nesting(env: jinja2.Environment, source: str) -> None:
    """Refuses blocks or brackets nested past MAX_NESTING, from jinja's token stream
    (the parser and compiler recurse once a level: 5,000 nested ifs used to raise a
    RecursionError)."""
    openers = {"if", "for", "macro", "call", "filter", "block", "with", "autoescape",
               "generation", "trans"}
    blocks = brackets = 0
    tag: str | None = None    # the statement's name, once its block has begun
    assigns = False           # `{% set x = ... %}`, not the block form `{% set x %}`
    for lineno, kind, value in env.lexer.tokenize(source):
        if kind == "block_begin":
            tag, assigns = None, False
        elif kind == "name" and tag is None:
            tag = value
            blocks += 1 if value in openers else -1 if value.startswith("end") else 0
        elif kind == "assign" and tag == "set":
            assigns = True
        elif kind == "block_end" and tag == "set" and not assigns:
            blocks += 1
        elif kind in ("lparen", "lbracket", "lbrace"):
            brackets += 1
        elif kind in ("rparen", "rbracket", "rbrace"):
            brackets -= 1
        if blocks > MAX_NESTING or brackets > MAX_NESTING:
            raise jinja2.exceptions.TemplateSyntaxError(
                f"nested more than {MAX_NESTING} deep", lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters.update(center=_center, indent=_indent, replace=_replace)
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
                 special_tokens: Mapping[str, str] | None = None,
                 seconds: float = RENDER_SECONDS) -> None:
        self.source, self.origin, self.seconds = source, origin, seconds
        self.special_tokens = dict(special_tokens or {})
        try:
            env = _environment()
            _check_nesting(env, source)
            self._template = within(seconds, lambda: env.from_string(source))
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{origin}: the chat template does not compile: "
                                    f"{_describe(exc)}") from None
        except (RecursionError, MemoryError, BudgetExceeded, SyntaxError) as exc:
            # SyntaxError: Python's own limit on the compiled code ("too many statically
            # nested blocks": about 20 nested loops)
            raise ChatTemplateError(f"{origin}: the chat template does not compile: "
                                    f"{_limit(exc, seconds)}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text for `messages`. Extra keyword arguments reach the template
        as variables (as in transformers), overriding the special tokens."""
        chat = _messages(messages)
        variables = {**self.special_tokens, **_plain(kwargs)}
        try:
            return within(self.seconds, lambda: self._bounded(
                messages=chat, tools=None, documents=None,
                add_generation_prompt=bool(add_generation_prompt), **variables))
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.origin}: the chat template failed: "
                                    f"{_describe(exc)}") from None
        except (RecursionError, MemoryError, BudgetExceeded) as exc:
            raise ChatTemplateError(f"{self.origin}: the chat template failed: "
                                    f"{_limit(exc, self.seconds)}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError,
                ZeroDivisionError, OverflowError) as exc:
            # a template is a program: its bugs surface as Python errors inside jinja
            raise ChatTemplateError(f"{self.origin}: the chat template failed: "
                                    f"{type(exc).__name__}: {exc}") from None

    def _bounded(self, **variables: Any) -> str:
        """The render, piece by piece, stopped once it passes MAX_RENDER_CHARS."""
        pieces, size = [], 0
        for piece in self._template.generate(**variables):
            size += len(piece)
            if size > MAX_RENDER_CHARS:
                raise _too_big("the rendered prompt")
            pieces.append(piece)
        return "".join(pieces)


def _limit(exc: BaseException, seconds: float) -> str:
    if isinstance(exc, RecursionError | SyntaxError):
        return "nested or recursing too deeply"
    if isinstance(exc, MemoryError):
        return "out of memory"
    return f"took longer than {seconds:g} s (a loop that does not end?)"


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
