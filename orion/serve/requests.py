"""The fields of /v1/completions and /v1/chat/completions, checked: every value a
client can get wrong is a 400 naming the field (`param`), never a crash later.

Supported: model, prompt (a string, one-string list or token ids) / messages,
max_tokens (max_completion_tokens too), temperature, top_p, seed, stop (a string or
up to 4), stream, stream_options.include_usage, n = 1, user (ignored). Fields Orion
cannot honour (logprobs, echo, best_of > 1, suffix, tools, penalties other than 0)
are a 400 rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orion.serve.errors import bad_request

MAX_STOPS = 4
MAX_STOP_CHARS = 256
MAX_MESSAGES = 1024
DEFAULT_MAX_TOKENS = 256


@dataclass
class GenerationRequest:
    """A checked request. `prompt` is text or token ids (completions) and `messages`
    the chat (chat completions); exactly one is set."""

    model: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    chat: bool = False
    extra_stop: list[str] = field(default_factory=list)


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float,
            *, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"'{name}' must be a number", name)
    value = float(value)
    if not (lo < value if lo_open else lo <= value) or not value <= hi:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise bad_request(f"'{name}' must be in {interval}, got {value:g}", name)
    return value


def _integer(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer", name)
    return value


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for name in ("logprobs", "top_logprobs", "echo", "suffix", "tools", "functions",
                 "tool_choice", "logit_bias", "response_format"):
        if body.get(name) not in (None, False, 0, {}, []):
            raise bad_request(f"'{name}' is not supported by this server", name)
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise bad_request(f"'{name}' is not supported (only 0)", name)
    if body.get("best_of") not in (None, 1):
        raise bad_request("'best_of' must be 1", "best_of")


def sampling_defaults(generation_defaults: Mapping[str, Any]) -> dict[str, float]:
    """temperature and top_p for requests that omit them: the model folder's
    generation_config.json values when it has them (as vLLM does), else OpenAI's 1.0.
    `do_sample: false` there means greedy."""
    out = {"temperature": 1.0, "top_p": 1.0}
    for name in out:
        value = generation_defaults.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    if generation_defaults.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def _common(body: Any, context: int, defaults: Mapping[str, float]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _refuse_unsupported(body)
    n = _integer(body, "n")
    if n not in (None, 1):
        raise bad_request(f"'n' must be 1 (this server makes one choice), got {n}", "n")
    max_tokens = _integer(body, "max_tokens")
    if max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, context)
    if not 1 <= max_tokens <= context:
        raise bad_request(f"'max_tokens' must be in [1, {context}] (the model's context), "
                          f"got {max_tokens}", "max_tokens")
    seed = _integer(body, "seed")
    if seed is not None and not 0 <= seed < 2**63:
        raise bad_request("'seed' must be in [0, 2**63)", "seed")
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS or not s for s in stops):
        raise bad_request(f"'stop' takes up to {MAX_STOPS} non-empty strings of at most "
                          f"{MAX_STOP_CHARS} characters", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad_request("'stream' must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool) and include_usage is not None:
        raise bad_request("'stream_options.include_usage' must be true or false",
                          "stream_options")
    return {
        "model": body.get("model"),
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", defaults.get("temperature", 1.0), 0.0, 2.0),
        "top_p": _number(body, "top_p", defaults.get("top_p", 1.0), 0.0, 1.0, lo_open=True),
        "seed": seed,
        "stop": stops,
        "stream": bool(stream),
        "include_usage": bool(include_usage),
    }


def completion_request(body: Any, context: int,
                       defaults: Mapping[str, float] | None = None) -> GenerationRequest:
    common = _common(body, context, defaults or {})
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]   # a batch of one
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        prompt = [int(t) for t in prompt]
    elif not isinstance(prompt, str):
        raise bad_request("'prompt' must be a string or a list of token ids (one prompt "
                          "per request)", "prompt")
    return GenerationRequest(prompt=prompt, **common)


def chat_request(body: Any, context: int,
                 defaults: Mapping[str, float] | None = None) -> GenerationRequest:
    common = _common(body, context, defaults or {})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
        raise bad_request(f"'messages' must be a list of 1 to {MAX_MESSAGES} messages",
                          "messages")
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a 'role'", "messages")
        content = m.get("content")
        if isinstance(content, list):   # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise bad_request(f"messages[{i}].content: only text parts are supported",
                                  "messages")
            content = "".join(p["text"] for p in content)
        if content is not None and not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string", "messages")
        checked.append({"role": m["role"], "content": content or ""})
    return GenerationRequest(messages=checked, chat=True, **common)
