"""Chat prompts for a model: its folder's chat template, or Orion's fallback.

A model folder with a chat template (`chat_template.jinja` or tokenizer_config.json)
is rendered exactly as transformers renders it (orion.tokenizers.chat_template). A model
without one — the shipped Shakespeare Llama is a base model with a SentencePiece
tokenizer and no template — gets `FALLBACK_TEMPLATE`, a plain transcript in the
shape of a play script:

    You are a helpful assistant.        <- a system message, as is

    USER:
    Hello there

    ASSISTANT:
    <the model writes here>

and its answer ends at the first blank line (`FALLBACK_STOPS`), where a play's next
speech would start. Both `orion serve` and `orion chat` build prompts here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orion.tokenizers.base import Tokenizer
from orion.tokenizers.chat_template import ChatTemplate

FALLBACK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% else %}{{ m['role'] | upper }}:\n{{ m['content'] }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}")
FALLBACK_STOPS = ("\n\n",)


@dataclass(frozen=True)
class ChatFormat:
    """How a model's chats become prompt ids.

    template:  the chat template
    stops:     stop strings every answer gets (the fallback's blank line; none for a
               model's own template, whose end tokens stop it)
    fallback:  True when the model has no template of its own
    """

    template: ChatTemplate
    stops: tuple[str, ...]
    fallback: bool
    tokenizer: Tokenizer

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The ids of `messages` with the assistant's turn opened."""
        text = self.template.render(messages, add_generation_prompt=True)
        if self.fallback:
            return self.tokenizer.encode(text)
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True)
        assert isinstance(ids, list)
        return ids


def chat_format(tokenizer: Tokenizer) -> ChatFormat:
    """The model's own template when its folder has one, else the fallback."""
    own = tokenizer.chat_template
    if own is not None:
        return ChatFormat(own, (), False, tokenizer)
    template = ChatTemplate(FALLBACK_TEMPLATE, origin="orion's fallback chat template")
    return ChatFormat(template, FALLBACK_STOPS, True, tokenizer)
