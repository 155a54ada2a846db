"""`orion chat [--model M] [--system TEXT]`: a terminal conversation with a model,
through its chat template (or Orion's fallback, orion.chat), streamed as it is written.

The history is re-rendered every turn and the KV cache of the previous turn reused
(orion.models.prefix_cache). When the history no longer fits the context with room
for an answer, the oldest turns drop and it says so. A line that starts with "/" is a
command, never sent to the model (`/help` lists them; "//" sends a line starting with
"/"); Ctrl-D quits, Ctrl-C stops the answer being written (not the program)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "/help lists the commands, /exit or Ctrl-D quits, Ctrl-C stops an answer"
COMMANDS = (   # (names, what it does); the first name is the one /help shows
    (("/help", "/?"), "this list"),
    (("/reset", "/clear"), "start the conversation over (the system message stays)"),
    (("/system",), "/system TEXT sets the system message and starts over; alone, shows it"),
    (("/exit", "/quit", "/bye"), "quit (so does Ctrl-D)"),
)


def command_help() -> str:
    lines = [f"  {names[0]:<8} {what}" + (f" (also {', '.join(names[1:])})"
                                            if len(names) > 1 else "")
             for names, what in COMMANDS]
    return "\n".join(["commands:", *lines,
                      "  a line starting with // is sent as a message starting with /",
                      "  Ctrl-C stops an answer being written"])


def slash_command(line: str) -> tuple[str, str] | None:
    """(command, argument) when `line` is a command: it starts with "/" but not "//".
    The command is its canonical name (first of COMMANDS' names), or the name as
    typed when it is unknown."""
    text = line.strip()
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, arg = text.partition(" ")
    name = name.lower()
    for names, _ in COMMANDS:
        if name in names:
            return names[0], arg.strip()
    return name, arg.strip()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "chat", help="chat with a model in the terminal",
        description="A conversation with a model through its chat template, streamed. "
        + HELP + ".")
    p.add_argument("--model", "-m", default=None,
                   help="model folder, file or repo id (default: the shipped Shakespeare Llama)")
    p.add_argument("--system", default=None, help="a system message opening the chat")
    p.add_argument("--adapter-path", default=None,
                   help="a PEFT LoRA adapter folder to chat with (orion lora writes one)")
    p.add_argument("--max-tokens", type=int, default=256,
                   help="most tokens per answer (256; less when the context is small)")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 is greedy (default: the model's generation_config.json, else 0.7)")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus sampling mass (default: generation_config.json, else 1.0)")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler")
    p.add_argument("--backend", default=None, help="vane, ane or auto (default: the best)")
    from orion.cli.speculative import add_flags

    add_flags(p)
    p.set_defaults(func=run)


def fit_history(history: list[dict[str, Any]], prompt_ids: Any, budget: int
                ) -> tuple[list[int] | None, int]:
    """(prompt ids, messages dropped): the oldest turns after a leading system message
    drop until the prompt is at most `budget` tokens. None when even the last message
    alone does not fit. `history` is trimmed in place."""
    dropped = 0
    while True:
        ids = prompt_ids(history)
        if len(ids) <= budget:
            return ids, dropped
        first = 1 if history and history[0]["role"] == "system" else 0
        if len(history) - first <= 1:
            return None, dropped
        del history[first]
        dropped += 1
        if len(history) - first > 1 and history[first]["role"] == "assistant":
            del history[first]   # never start on an answer without its question
            dropped += 1


def run(args: argparse.Namespace) -> int:
    import orion
    from orion.chat import chat_format
    from orion.models.prefix_cache import PrefixCachedLM
    from orion.models.registry import default_model_path

    model, tokenizer = orion.load(args.model or str(default_model_path()),
                                  backend=args.backend,
                                  **({"adapter_path": args.adapter_path}
                                     if args.adapter_path else {}))
    fmt = chat_format(tokenizer)
    defaults = getattr(tokenizer, "generation_defaults", {})
    temperature = args.temperature if args.temperature is not None else (
        0.0 if defaults.get("do_sample") is False else float(defaults.get("temperature", 0.7)))
    top_p = args.top_p if args.top_p is not None else float(defaults.get("top_p", 1.0))
    lm = PrefixCachedLM(model)
    from orion.cli.speculative import options

    try:
        speculation, draft = options(args)
    except BaseException:
        model.close()
        raise
    context = model.max_length
    answer_room = max(1, min(args.max_tokens, context // 4))
    start = [{"role": "system", "content": args.system}] if args.system else []
    history = list(start)
    out = sys.stdout
    print(f"orion chat ({context}-token context). {HELP}.")
    if fmt.fallback:
        print("(the model has no chat template: using Orion's plain USER:/ASSISTANT: "
              "transcript; an answer ends at a blank line)")
    try:
        while True:
            try:
                line = input(">>> ")
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                print(f"\n({HELP})")
                continue
            text = line.strip()
            command = slash_command(line)
            if command is not None:
                name, arg = command
                if name == "/exit":
                    return 0
                if name == "/help":
                    print(command_help())
                elif name == "/reset":
                    history = list(start)
                    print("(conversation cleared)")
                elif name == "/system" and arg:
                    start = [{"role": "system", "content": arg}]
                    history = list(start)
                    print("(system message set; conversation cleared)")
                elif name == "/system":
                    print(f"(system message: {start[0]['content']!r})" if start
                          else "(no system message)")
                else:
                    print(f"(unknown command {name}: /help lists the commands; start "
                          "with // to send a line that begins with /)")
                continue
            if not text:
                continue
            if text.startswith("//"):
                line = line.replace("/", "", 1)   # the escape: one "/" of the two goes
            history.append({"role": "user", "content": line})
            ids, dropped = fit_history(history, fmt.prompt_ids, context - answer_room)
            if ids is None:
                history.pop()
                print(f"(that message is too long for the model's {context}-token context)")
                continue
            if dropped:
                print(f"(dropped the {dropped} oldest message{'s' if dropped > 1 else ''} "
                      f"to stay within the {context}-token context)")
            pieces = []
            try:
                for response in orion.stream_generate(
                        lm, ids, max_tokens=answer_room, temperature=temperature,
                        top_p=top_p, seed=args.seed, stop=list(fmt.stops), **speculation):
                    if response.text:
                        out.write(response.text)
                        out.flush()
                        pieces.append(response.text)
            except KeyboardInterrupt:
                out.write("\n(stopped)")
            out.write("\n")
            out.flush()
            history.append({"role": "assistant", "content": "".join(pieces)})
    finally:
        model.close()
        if draft is not None:
            draft.close()
