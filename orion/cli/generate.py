"""`orion generate [--model PATH] "prompt"`: streams the continuation to the terminal.
A thin caller of `orion.load` and `orion.stream_generate`. Without --model it runs
the small Shakespeare Llama the package ships, so a fresh install writes text
with no download.

As mlx-lm's `generate` does, a model whose folder has a chat template gets the prompt
as a user message through it (with --system's message first); --ignore-chat-template
sends the raw text. The prompt comes from the argument, --prompt-file, or stdin."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from orion.cli.speculative import add_flags as add_speculative_flags
from orion.errors import InvalidArgumentError

MAX_PROMPT_BYTES = 64 << 20   # far past any model's context; a bound on what is read


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="generate text from a prompt",
        description="Load a model (a Hugging Face folder with config.json and "
        "model.safetensors, a llama2.c .bin, or a hub repo id when huggingface_hub is "
        "installed and online) and stream a continuation of the prompt. When the model "
        "has a chat template (an instruct model), the prompt is sent through it as a "
        "user message, as mlx-lm does.")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt; '-' or nothing reads it from stdin")
    # mlx_lm.generate's flag; without it argparse read `--prompt TEXT` as an
    # abbreviation of --prompt-file and looked for a file named TEXT
    p.add_argument("--prompt", "-p", dest="prompt_text", default=None, metavar="TEXT",
                   help="the prompt, as an option (as mlx_lm.generate takes it); '-' reads "
                   "stdin")
    p.add_argument("--prompt-file", default=None, metavar="PATH",
                   help="read the prompt from this UTF-8 file ('-': stdin)")
    p.add_argument("--model", "-m", default=None,
                   help="model folder, file or repo id (default: the shipped Shakespeare "
                   "Llama, orion/assets/shakespeare-llama)")
    p.add_argument("--adapter-path", default=None,
                   help="a PEFT LoRA adapter folder to apply (orion lora writes one)")
    p.add_argument("--system", "--system-prompt", default=None, metavar="TEXT",
                   help="a system message before the prompt (needs a chat template)")
    p.add_argument("--ignore-chat-template", action="store_true",
                   help="send the prompt as raw text even when the model has a chat "
                   "template")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (256)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 is greedy (default); higher samples more freely")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages repeating context tokens (1.0: off)")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler")
    p.add_argument("--stop", action="append", default=[],
                   help="stop before this string (repeatable)")
    p.add_argument("--backend", default=None, help="vane, ane or auto (default: the best)")
    p.add_argument("--stats", action="store_true",
                   help="print the prompt's tokens, prefill ms, compile ms, decode tokens/s, "
                   "compiles and cache hits to stderr (also when stopped with Ctrl-C); "
                   "with speculation, the drafts accepted and tokens an eval")
    add_speculative_flags(p)
    p.set_defaults(func=run)


def _prompt_error(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message)


def _decoded(data: bytes) -> str:
    # bad UTF-8 becomes the API's typed error (lone surrogates), not a decode crash
    return data.decode("utf-8", "surrogateescape")


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt: the argument (or --prompt), --prompt-file's file, or stdin ('-' or
    nothing)."""
    text = getattr(args, "prompt_text", None)
    if text is not None:
        if args.prompt is not None or args.prompt_file is not None:
            raise _prompt_error("give the prompt once: as an argument, with --prompt or "
                                "with --prompt-file")
        args.prompt = text
    if args.prompt_file is not None:
        if args.prompt is not None:
            raise _prompt_error("give the prompt as an argument or with --prompt-file, "
                                "not both")
        if args.prompt_file != "-":
            from orion.files import read_bytes

            return _decoded(read_bytes(args.prompt_file, max_bytes=MAX_PROMPT_BYTES))
    elif args.prompt is not None and args.prompt != "-":
        return args.prompt
    if sys.stdin.isatty():
        raise _prompt_error("give a prompt, or pipe one on stdin")
    stdin = getattr(sys.stdin, "buffer", None)
    if stdin is None:   # a text stream (tests, embedders)
        return sys.stdin.read()
    data = stdin.read(MAX_PROMPT_BYTES + 1)
    if len(data) > MAX_PROMPT_BYTES:
        raise _prompt_error(f"the prompt on stdin is over {MAX_PROMPT_BYTES} bytes")
    return _decoded(data)


def prompt_ids(tokenizer: Any, prompt: str, *, system: str | None,
               ignore_chat_template: bool) -> list[int]:
    """The prompt's token ids: through the model's own chat template when it has one
    (Orion's plain-transcript fallback is for `orion chat` only, as mlx-lm sends a
    base model the raw text), else encoded as text, BOS included where the tokenizer
    adds one."""
    for part in (prompt, system or ""):
        try:
            part.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _prompt_error(f"the prompt is not valid UTF-8 (at character "
                                f"{exc.start})") from None
    from orion.chat import chat_format

    fmt = chat_format(tokenizer)
    if fmt.fallback or ignore_chat_template:
        if system is not None:
            why = ("--ignore-chat-template sends raw text" if not fmt.fallback
                   else "the model has no chat template")
            raise _prompt_error(f"--system needs the model's chat template, and {why}; "
                                "put the text in the prompt instead")
        return list(tokenizer.encode(prompt))
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": prompt})
    return fmt.prompt_ids(messages)


def _stats_line(last: Any, prompt_tokens: int, started: float) -> str:
    """The stats summary of an interrupted call: what it did until Ctrl-C."""
    if last is None:
        return (f"prompt {prompt_tokens} tokens; interrupted in the prefill after "
                f"{1e3 * (time.perf_counter() - started):.0f} ms; finish: interrupted")
    return dataclasses.replace(last, finish_reason="interrupted").summary()


def _plan_line(model: Any, load_s: float) -> str:
    """What the load found: the program plan and the compiles it still needs (the
    programs neither compiled nor in the program store)."""
    from orion.models.runtime import TransformerLM

    if not isinstance(model, TransformerLM):
        return f"loaded in {1e3 * load_s:.0f} ms"
    return (f"loaded in {1e3 * load_s:.0f} ms; plan: {model.plan.describe()}; "
            f"{model.compiles_needed} of them to compile")


def run(args: argparse.Namespace) -> int:
    import orion

    prompt = read_prompt(args)
    model_path = args.model
    if model_path is None:
        from orion.models.registry import default_model_path

        model_path = str(default_model_path())
    loading = time.perf_counter()
    model, tokenizer = orion.load(
        model_path, backend=args.backend,
        **({"adapter_path": args.adapter_path} if args.adapter_path else {}))
    if args.stats:
        print(_plan_line(model, time.perf_counter() - loading), file=sys.stderr)
    draft = None
    out = sys.stdout
    last = None
    ends_line = True   # whether stdout is at the start of a line
    started = time.perf_counter()
    ids: list[int] | None = None
    try:
        ids = prompt_ids(tokenizer, prompt, system=args.system,
                         ignore_chat_template=args.ignore_chat_template)
        from orion.cli.speculative import options

        speculation, draft = options(args)
        started = time.perf_counter()
        for response in orion.stream_generate(
                model, ids, max_tokens=args.max_tokens, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop,
                **speculation):
            if response.text:
                out.write(response.text)
                out.flush()
                ends_line = response.text.endswith("\n")
            last = response.stats
    except BaseException as exc:
        if not ends_line:   # end the text's line, so that the error message starts its own
            try:
                out.write("\n")
                out.flush()
            except OSError:   # the reader left (a closed pipe): nothing to end
                pass
        if args.stats and isinstance(exc, KeyboardInterrupt) and ids is not None:
            print(_stats_line(last, len(ids), started), file=sys.stderr)
        raise
    finally:
        model.close()
        if draft is not None:
            draft.close()
    out.write("\n")
    out.flush()   # before the stats on stderr, so a terminal shows them in order
    if last is not None and last.cut_at_context:
        print(f"orion generate: output cut at the model's context ({model.max_length} "
              f"tokens): {last.generated_tokens} generated after a {last.prompt_tokens}-token "
              f"prompt, --max-tokens asked for {args.max_tokens}", file=sys.stderr)
    if args.stats and last is not None:
        print(last.summary(), file=sys.stderr)
    return 0
