"""Text generation: `load`, `generate`, `stream_generate` (the mlx-lm shape).

    import orion
    model, tokenizer = orion.load("path/to/gpt2")
    print(orion.generate(model, "The meaning of life is", max_tokens=32))
    for piece in orion.stream_generate(model, "Once upon a time", temperature=0.8, seed=0):
        print(piece.text, end="", flush=True)

`stream_generate` yields a `GenerationResponse` per decoded token whose text is ready:
its `text` is always whole UTF-8 characters (a token that ends inside a character is
held back until the character is complete), and never part of a stop string. Each
response carries the call's `GenerationStats` so far: prefill ms, decode tokens/s,
programs compiled and program-cache hits during the call.
"""

from __future__ import annotations

import codecs
import numbers
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from orion.errors import InvalidArgumentError
from orion.models.base import CausalLM, check_token_ids
from orion.models.registry import default_model_path, load_model
from orion.sample import Sampler, SamplingOptions
from orion.speculative import SpeculationStats
from orion.tokenizers.base import Tokenizer


def load(path_or_id: str | os.PathLike[str] | None = None, *, backend: str | None = None,
         adapter_path: str | os.PathLike[str] | None = None,
         **options: Any) -> tuple[CausalLM, Tokenizer]:
    """A model and its tokenizer from a local folder or file, or a Hugging Face repo id
    (when huggingface_hub is installed and online); with no path, the small Shakespeare
    Llama the package ships. `backend`: "vane", "ane", or None for the best available.
    `adapter_path`: a PEFT LoRA adapter folder, loaded as "default" and selected. Other
    options go to `orion.models.load_model`."""
    if path_or_id is None:
        path_or_id = default_model_path()
    if adapter_path is not None:
        options["adapter_path"] = adapter_path
    model = load_model(path_or_id, backend=backend, **options)
    try:
        return model, model.tokenizer
    except BaseException:
        model.close()   # a folder without a tokenizer: release what was allocated
        raise


@dataclass
class GenerationStats:
    """What one generate call did.

    prompt_tokens, generated_tokens: counts
    prefill_ms:          wall time of the prompt's prefill, compiles excluded
    decode_ms:           wall time of the decode steps, compiles excluded
    compile_ms:          time spent compiling programs during the call (the prefill's
                         and the decode steps'), reported on its own
    decode_tokens_per_s: decode steps per second (the first token comes from prefill)
    programs_compiled:   compiles during the call (0 once the model is warm)
    programs_reused:     programs opened from the program store during the call (an
                         earlier process compiled them)
    cache_hits:          program requests served from the model's program cache
    finish_reason:       "eos", "stop" (a stop string), "length" (max_tokens or the
                         context), or None while running
    cut_at_context:      the "length" finish came from the model's context (its
                         `max_length`, prompt included) before max_tokens
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    decode_steps: int = 0
    compile_ms: float = 0.0
    programs_compiled: int = 0
    programs_reused: int = 0
    cache_hits: int = 0
    finish_reason: str | None = None
    cut_at_context: bool = False
    speculation: SpeculationStats | None = None   # drafted, accepted, steps (speculative)

    @property
    def decode_tokens_per_s(self) -> float:
        return 1e3 * self.decode_steps / self.decode_ms if self.decode_ms > 0 else 0.0

    def summary(self) -> str:
        return (f"prompt {self.prompt_tokens} tokens, prefill {self.prefill_ms:.1f} ms; "
                f"compiling {self.compile_ms:.0f} ms; "
                f"generated {self.generated_tokens} tokens, decode "
                f"{self.decode_tokens_per_s:.1f} tokens/s; programs compiled "
                f"{self.programs_compiled}, reused {self.programs_reused}, cache hits "
                f"{self.cache_hits}; finish: "
                f"{self.finish_reason}{' (cut at the context)' if self.cut_at_context else ''}"
                + self._speculation())

    def _speculation(self) -> str:
        s = self.speculation
        if s is None:
            return ""
        return (f"; speculative: {s.accepted} of {s.drafted} drafts accepted "
                f"({100 * s.acceptance:.0f}%), {s.tokens_per_step:.2f} tokens an eval "
                f"({s.verify_steps} verify + {s.decode_steps} decode steps"
                + (f", drafts declined at {s.declined}" if s.declined else "") + ")")


@dataclass
class GenerationResponse:
    """One step of `stream_generate`: the new text (possibly empty while a character
    or a possible stop string is incomplete), the token, and the call's stats."""

    text: str
    token: int | None
    stats: GenerationStats = field(default_factory=GenerationStats)

    @property
    def finish_reason(self) -> str | None:
        return self.stats.finish_reason


class StreamingDetokenizer:
    """Token ids in, text out in whole characters.

    Where a tokenizer's bytes concatenate (byte-level BPE, SentencePiece pieces), each
    token's bytes go through an incremental UTF-8 decoder. Otherwise the whole output
    is decoded each time and text is released only when it does not end in U+FFFD (an
    incomplete character).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._bytes = tokenizer.decode_bytes if tokenizer.bytes_concatenate else None
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._released = ""

    def add(self, token: int) -> str:
        if self._bytes is not None:
            return self._utf8.decode(self._bytes([token]))
        self._ids.append(token)
        text = self.tokenizer.decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        new, self._released = text[len(self._released):], text
        return new

    def flush(self) -> str:
        if self._bytes is not None:
            return self._utf8.decode(b"", final=True)
        text = self.tokenizer.decode(self._ids)
        new, self._released = text[len(self._released):], text
        return new


class _StopStrings:
    """Holds back text that could be the start of a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""      # everything seen
        self.sent = 0       # characters released

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to release, stopped)."""
        self.text += piece
        start = max(0, self.sent - self.longest)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            end = min(hits)
            out, self.sent = self.text[self.sent:end], end
            return out, True
        safe = len(self.text)
        for k in range(min(self.longest - 1, len(self.text)), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                safe = len(self.text) - k
                break
        safe = max(safe, self.sent)
        out, self.sent = self.text[self.sent:safe], safe
        return out, False

    def rest(self) -> str:
        out, self.sent = self.text[self.sent:], len(self.text)
        return out


def _checked_text(prompt: str) -> str:
    """The prompt, refused when it holds lone surrogates (bytes that were not UTF-8,
    as Python decodes a bad command line), which no tokenizer can encode."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"the prompt is not valid UTF-8 (at character "
                                   f"{exc.start})") from None
    return prompt


def _vocab_size(model: CausalLM) -> int:
    """The rows of the model's embedding (what an id indexes)."""
    return int(model.config.vocab_size)


def _sampled_ids(model: CausalLM) -> int:
    """How many ids the sampler may pick: the model's rows, but none past the
    tokenizer's vocabulary. Real models have embedding rows no token uses (Qwen2.5:
    151,936 rows, 151,665 ids); such an id would not decode."""
    return min(_vocab_size(model), int(model.tokenizer.vocab_size))


def _stop_strings(stop: object) -> list[str]:
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, bytes | bytearray) or not isinstance(stop, Sequence) \
            or not all(isinstance(s, str) for s in stop):
        raise InvalidArgumentError(f"stop must be a string or a list of strings, got "
                                   f"{stop!r}"[:200])
    return list(stop)


def end_token_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Every token that ends a generation: a tokenizer's `eos_token_ids` when it has
    them (Llama 3 has several), else its one `eos_token_id`."""
    many = tokenizer.eos_token_ids
    if many:
        return frozenset(int(i) for i in many)
    return frozenset() if tokenizer.eos_token_id is None else frozenset({tokenizer.eos_token_id})


KEEP_ADAPTER = object()   # stream_generate's default: the model's selected adapter
# drafted tokens a speculative step: with the last token, 8 rows, a verify bucket
DRAFT_TOKENS = 7


def stream_generate(
    model: CausalLM,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] | str = (),
    stop_at_eos: bool = True,
    adapter: str | None | object = KEEP_ADAPTER,
    speculative: str | CausalLM | None = None,
    draft_tokens: int = DRAFT_TOKENS,
) -> Iterator[GenerationResponse]:
    """Generates up to `max_tokens` tokens after `prompt`, yielding a
    `GenerationResponse` for each piece of text as soon as it is whole.

    model:              a loaded `CausalLM` (from `orion.load`); its KV cache is reset
    prompt:             text, encoded with `model.tokenizer.encode` (no chat
                        template): a tokenizer.json folder adds a BOS where transformers'
                        tokenizer(text) does (its post-processor: Meta's Llama 3 files
                        add one, Qwen's do not; without one, tokenizer_config.json's
                        add_bos_token, transformers 4's rule); a SentencePiece
                        tokenizer.model or GPT-2's vocabulary adds none. Or token ids,
                        used as given. Empty means "start from the end-of-text token"
    max_tokens:         the most tokens to generate (>= 0); generation also ends when
                        the model's context (`model.max_length`, prompt included) is
                        full, which sets `stats.cut_at_context`
    temperature:        0 picks the most likely token (greedy); higher flattens the
                        distribution before sampling
    top_k:              sample only among the k most likely tokens (0: all)
    top_p:              sample only among the most likely tokens whose probabilities
                        add up to p (nucleus sampling; 1.0: off)
    repetition_penalty: > 1 lowers the logits of tokens already in the context (the
                        CTRL rule transformers uses; 1.0: off)
    seed:               seeds the sampler, so a sampled run repeats exactly (None:
                        fresh randomness)
    stop:               a string or strings; generation ends before the first one the
                        text contains, and the stop string itself is never yielded

    Only ids of the tokenizer's vocabulary are sampled: logits of the model's rows
    past it (padding rows no token uses) are never picked.
    stop_at_eos:        end when the model samples its end-of-text token (which is not
                        yielded); False keeps generating through it
    adapter:            the name of a loaded LoRA adapter, or None for the base model,
                        for this call only (default: the model's selected adapter)
    speculative:        speculative decoding (docs/generate.md): "prompt" drafts by
                        prompt lookup, verifying only while its drafts are right
                        often enough to pay (`orion.speculative.PromptLookup(
                        adaptive=False)` verifies every draft), a loaded `CausalLM` of
                        the same tokenizer is a draft model; drafts are checked by one
                        `verify` eval of the model. The output is plain decoding's:
                        token for token when greedy, in distribution when sampled.
                        None: off
    draft_tokens:       the most tokens drafted a step (1 .. 31)

    The last response has `finish_reason` "eos", "stop" or "length"; every response
    carries the call's `GenerationStats` so far. Raises InvalidArgumentError (a
    ValueError) for a max_tokens that is not an integer >= 0, or for an empty prompt
    with a tokenizer that has no end-of-text token.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) \
            or max_tokens < 0:
        raise InvalidArgumentError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    if adapter is not KEEP_ADAPTER:
        if adapter is not None and not isinstance(adapter, str):
            raise InvalidArgumentError(f"adapter must be a name or None, got {adapter!r}")
        previous = model.active_adapter
        model.set_adapter(adapter)
        try:
            yield from stream_generate(model, prompt, max_tokens=max_tokens,
                                       temperature=temperature, top_k=top_k, top_p=top_p,
                                       repetition_penalty=repetition_penalty, seed=seed,
                                       stop=stop, stop_at_eos=stop_at_eos,
                                       speculative=speculative, draft_tokens=draft_tokens)
        finally:
            model.set_adapter(previous)
        return
    sampler = Sampler(SamplingOptions(temperature=temperature, top_k=top_k, top_p=top_p,
                                      repetition_penalty=repetition_penalty, seed=seed))
    stops = _StopStrings(_stop_strings(stop))
    tokenizer = model.tokenizer
    sampled = _sampled_ids(model)
    if isinstance(prompt, str):
        ids = tokenizer.encode(_checked_text(prompt))
    elif isinstance(prompt, bytes | bytearray):
        raise InvalidArgumentError("the prompt must be text (str) or token ids, not bytes")
    else:
        ids = prompt
    ids = check_token_ids(ids, _vocab_size(model))
    if not ids:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise InvalidArgumentError("an empty prompt needs a tokenizer with an "
                                       "end-of-text token")
        ids = [eos]   # GPT-2's convention: generate from <|endoftext|>
    stats = GenerationStats(prompt_tokens=len(ids))
    before = model.stats.snapshot()
    detok = StreamingDetokenizer(tokenizer)
    eos_ids = end_token_ids(tokenizer) if stop_at_eos else frozenset()

    def drain() -> str:
        """What is still held back at the end: an incomplete character, a possible
        stop-string prefix that never completed."""
        tail, stopped = stops.feed(detok.flush())
        if stopped:
            stats.finish_reason = "stop"
            return tail
        return tail + stops.rest()

    def sync() -> GenerationStats:
        delta = model.stats.since(before)
        stats.programs_compiled, stats.cache_hits = delta.programs_compiled, delta.cache_hits
        stats.programs_reused = delta.programs_reused
        stats.compile_ms = delta.compile_ms
        if stats.speculation is not None:   # tokens the decode steps made, several a verify
            stats.decode_steps = stats.speculation.tokens
        return stats

    if max_tokens == 0:
        stats.finish_reason = "length"
        yield GenerationResponse("", None, sync())
        return
    drafter = _drafter(model, speculative, draft_tokens)
    compiling, t0 = model.stats.compile_ms, time.perf_counter()
    logits = model.prefill(ids)
    spent = 1e3 * (time.perf_counter() - t0) - (model.stats.compile_ms - compiling)
    stats.prefill_ms = max(spent, 0.0)   # compiles are compile_ms's, as for decode
    context = list(ids)

    def timed(step: Any, *args: Any) -> Any:
        """A device step, its time in decode_ms (compiles excluded)."""
        compiling, t1 = model.stats.compile_ms, time.perf_counter()
        out = step(*args)
        spent = 1e3 * (time.perf_counter() - t1) - (model.stats.compile_ms - compiling)
        stats.decode_ms += max(spent, 0.0)
        return out

    def plain() -> Iterator[int]:
        nonlocal logits
        while True:
            yield sampler(logits[..., :sampled], context)
            logits = timed(model.decode, context[-1])
            stats.decode_steps += 1

    if drafter is not None:
        from orion.speculative import speculative_tokens

        drafter.start(ids)
        stats.speculation = SpeculationStats()
        tokens = speculative_tokens(model, logits, context, sampler, sampled, drafter,
                                    draft_tokens, stats.speculation, timed)
    else:
        tokens = plain()
    for token in tokens:
        if token in eos_ids:
            stats.finish_reason = "eos"
            yield GenerationResponse(drain(), None, sync())
            return
        context.append(token)
        stats.generated_tokens += 1
        text, stopped = stops.feed(detok.add(token))
        if stopped:
            stats.finish_reason = "stop"
            yield GenerationResponse(text, token, sync())
            return
        # the cache holds every token but this one: full when it reaches the context
        if stats.generated_tokens >= max_tokens or len(context) - 1 >= model.max_length:
            stats.finish_reason = "length"
            stats.cut_at_context = stats.generated_tokens < max_tokens
            text += drain()
            yield GenerationResponse(text, token, sync())
            return
        yield GenerationResponse(text, token, sync())


DRAFT_TOKENS_MAX = 31   # 1 + drafts fill the largest verify bucket (orion.models.plan)


def check_draft_tokens(draft_tokens: object) -> int:
    """`draft_tokens` as an int in 1 .. DRAFT_TOKENS_MAX, else InvalidArgumentError."""
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, numbers.Integral) \
            or not 1 <= draft_tokens <= DRAFT_TOKENS_MAX:
        raise InvalidArgumentError(f"draft_tokens must be an integer in 1 .. "
                                   f"{DRAFT_TOKENS_MAX}, got {draft_tokens!r}")
    return int(draft_tokens)


def _drafter(model: CausalLM, speculative: object, draft_tokens: object) -> Any:
    """The drafter `speculative` names, its verify programs planned (a PlanError
    before anything runs when they do not fit the compile budget); None: off."""
    if speculative is None:
        return None
    check_draft_tokens(draft_tokens)
    from orion.speculative import DraftModel, PromptLookup

    if speculative == "prompt":
        drafter: Any = PromptLookup()
    elif isinstance(speculative, PromptLookup):   # its own n-gram sizes or policy
        drafter = speculative
    elif isinstance(speculative, str):
        raise InvalidArgumentError(f"speculative must be \"prompt\", a loaded draft model "
                                   f"or None, got {speculative!r} (load a draft model with "
                                   f"orion.load)")
    elif hasattr(speculative, "decode") and hasattr(speculative, "truncate"):
        if speculative is model:
            raise InvalidArgumentError("the draft model must be another model object than "
                                       "the target (load the folder twice for a self-draft)")
        drafter = DraftModel(speculative, model)
    else:
        raise InvalidArgumentError(f"speculative must be \"prompt\", a PromptLookup, a loaded "
                                   f"draft model or None, got {type(speculative).__name__}")
    plan = getattr(model, "plan_verify", None)
    if plan is None:
        raise InvalidArgumentError(f"{type(model).__name__} has no verify programs: "
                                   f"speculative decoding needs a TransformerLM")
    from orion.models.plan import verify_rows

    plan(verify_rows(1 + int(draft_tokens)))
    return drafter


def generate(model: CausalLM, prompt: str | Sequence[int], *,
             stats: GenerationStats | None = None, verbose: bool = False,
             **options: Any) -> str:
    """The generated text (not the prompt). Options as for `stream_generate`. Pass a
    `GenerationStats` as `stats` to receive the call's figures; `verbose` prints them
    to stderr."""
    pieces = []
    last = GenerationStats()
    for response in stream_generate(model, prompt, **options):
        pieces.append(response.text)
        last = response.stats
    if stats is not None:
        stats.__dict__.update(last.__dict__)
    if verbose:
        import sys

        print(last.summary(), file=sys.stderr)
    return "".join(pieces)
