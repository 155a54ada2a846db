"""mlx-lm's LoRA data folders: train.jsonl, valid.jsonl (and optional test.jsonl), one
JSON object a line, each one of

    {"text": ...}                       loss on every token
    {"prompt": ..., "completion": ...}  loss on the completion only
    {"messages": [...]}                 rendered with the model's chat template (the
                                        tokenizer's `apply_chat_template`), loss on
                                        assistant turns only

A line that is not one of these is an error naming the file and the line number.
Lines are split at "\n" only, as JSON Lines are (a raw U+2028 inside a JSON string is
text), each at most `MAX_LINE_BYTES` (a longer one is an error before it is read
whole), and parsed with bounds (orion.bounded_json: a 5000-digit number is an error
naming the line).
Each example is tokenized (prompt and completion separately, then joined; an
end-of-text token appended when the tokenizer has one) and TRUNCATED to
max_seq_length + 1 tokens: no packing, one example per sequence, shorter ones padded
with masked positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orion.bounded_json import JSONInputError, loads
from orion.errors import LoraError
from orion.files import MAX_TEXT_BYTES, inside, iter_lines
from orion.tokenizers.base import Tokenizer

SPLITS = ("train", "valid", "test")
MAX_LINE_BYTES = 16 << 20   # one example; a chat for a 128k context is ~0.5 MB


@dataclass
class Example:
    ids: list[int]        # tokens, inputs are ids[:-1], targets ids[1:]
    mask: list[int]       # per target: 1 when the loss counts


@dataclass
class Split:
    examples: list[Example]
    truncated: int        # examples cut to max_seq_length + 1 tokens

    def batch(self, indices: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, targets, mask), each [len(indices), seq], padded with masked zeros."""
        n = len(indices)
        tokens, targets, mask = (np.zeros((n, seq), np.int64) for _ in range(3))
        for row, i in enumerate(indices):
            ex = self.examples[int(i)]
            k = len(ex.ids) - 1
            tokens[row, :k], targets[row, :k], mask[row, :k] = ex.ids[:-1], ex.ids[1:], ex.mask
        return tokens, targets, mask

    @property
    def longest(self) -> int:
        return max(len(e.ids) - 1 for e in self.examples)


def _messages(where: str, messages: object, tokenizer: Tokenizer) -> Example:
    """The chat rendered by the tokenizer's chat template (`apply_chat_template`, which
    tokenizers that have a template provide), with the loss on the tokens of assistant
    turns only: each one's tokens are those the rendering of the chat up to it adds to
    the rendering of the chat before it (with the generation prompt)."""
    render = tokenizer.apply_chat_template
    if tokenizer.chat_template is None:
        raise LoraError(f"{where}: a 'messages' line needs the model's chat template, and "
                        "this model's tokenizer has none; use 'text' or "
                        "'prompt'/'completion' lines")
    if not (isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages)):
        raise LoraError(f"{where}: 'messages' must be a list of {{'role', 'content'}} "
                        "objects with string values")
    if messages[0]["role"] == "assistant":
        # there is no chat before it to render (templates refuse an empty one), so what
        # the template puts before the turn (a default system prompt, the turn's header)
        # could not be told apart from the turn itself
        raise LoraError(f"{where}: the chat opens with an assistant turn, whose tokens "
                        "cannot be told apart from what the chat template puts before "
                        "it; start the chat with a system or user message")
    try:
        ids = list(render(messages, add_generation_prompt=False, tokenize=True))
        spans = []
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = render(messages[:k], add_generation_prompt=True, tokenize=True)
            through = render(messages[:k + 1], add_generation_prompt=False, tokenize=True)
            if list(through) != ids[:len(through)] or list(before) != ids[:len(before)]:
                raise LoraError(f"{where}: the chat template does not render the chat "
                                "up to an assistant turn as a prefix of the whole chat, so "
                                "its tokens cannot be told apart")
            spans.append((len(before), len(through)))
    except LoraError:
        raise
    except (ValueError, TypeError) as exc:   # the template's own errors (OrionError too)
        raise LoraError(f"{where}: {exc}") from None
    if not spans:
        raise LoraError(f"{where}: no assistant turn to compute a loss on")
    counted = [0] * len(ids)
    for lo, hi in spans:
        counted[lo:hi] = [1] * (hi - lo)
    return Example(ids, counted[1:])   # target j predicts ids[j + 1]


def _example(where: str, obj: object, tokenizer: Tokenizer) -> Example:
    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None else []
    if not isinstance(obj, dict):
        raise LoraError(f"{where}: not a JSON object")
    if "messages" in obj:
        return _messages(where, obj["messages"], tokenizer)
    if "text" in obj:
        if not isinstance(obj["text"], str):
            raise LoraError(f"{where}: 'text' is not a string")
        ids = tokenizer.encode(obj["text"]) + tail
        return Example(ids, [1] * (len(ids) - 1))
    if "prompt" in obj and "completion" in obj:
        p, c = obj["prompt"], obj["completion"]
        if not isinstance(p, str) or not isinstance(c, str):
            raise LoraError(f"{where}: 'prompt' and 'completion' must be strings")
        pi, ci = tokenizer.encode(p), tokenizer.encode(c) + tail
        ids = pi + ci
        # target j predicts ids[j + 1]: it counts when that token is the completion's
        return Example(ids, [0] * (len(pi) - 1) + [1] * len(ci))
    raise LoraError(f"{where}: expected a 'text', 'prompt' + 'completion' or 'messages' "
                    f"line, got keys {sorted(obj)[:5]}")


def load_split(path: Path, tokenizer: Tokenizer, max_seq_length: int) -> Split:
    examples, truncated = [], 0
    for n, raw in iter_lines(path, max_bytes=MAX_TEXT_BYTES, max_line_bytes=MAX_LINE_BYTES):
        where = f"{path}, line {n}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LoraError(f"{where}: not UTF-8 (bad byte at column {exc.start + 1})"
                            ) from None
        if not line.strip(" \t\r"):   # JSON's own whitespace: a blank line
            continue
        try:
            obj = loads(line)
        except JSONInputError as exc:
            raise LoraError(f"{where}: {exc}") from None
        ex = _example(where, obj, tokenizer)
        if len(ex.ids) > max_seq_length + 1:
            ex = Example(ex.ids[:max_seq_length + 1], ex.mask[:max_seq_length])
            truncated += 1
        if len(ex.ids) < 2 or not any(ex.mask):
            raise LoraError(f"{where}: no token to compute a loss on")
        examples.append(ex)
    if not examples:
        raise LoraError(f"{path}: no examples")
    return Split(examples, truncated)


def load_folder(folder: str | Path, tokenizer: Tokenizer, max_seq_length: int
                ) -> dict[str, Split]:
    """The splits present in a data folder; train.jsonl and valid.jsonl are required."""
    folder = Path(folder)
    out: dict[str, Split] = {}
    for name in SPLITS:
        path = inside(folder, f"{name}.jsonl")
        if path.exists():
            out[name] = load_split(path, tokenizer, max_seq_length)
        elif name != "test":
            raise LoraError(f"{folder}: no {name}.jsonl")
    return out
