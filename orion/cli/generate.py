"""`orion generate [--model PATH] "prompt"`: streams the continuation to the terminal.
A thin caller of `orion.load` and `orion.stream_generate`. Without --model it runs
the small Shakespeare Llama the package ships, so a fresh install writes text
with no download."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="generate text from a prompt",
        description="Load a model (a Hugging Face folder with config.json and "
        "model.safetensors, a llama2.c .bin, or a hub repo id when huggingface_hub is "
        "installed and online) and stream a continuation of the prompt.")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt; '-' or nothing reads it from stdin")
    p.add_argument("--model", "-m", default=None,
                   help="model folder, file or repo id (default: the shipped Shakespeare "
                   "Llama, orion/assets/shakespeare-llama)")
    p.add_argument("--adapter-path", default=None,
                   help="a PEFT LoRA adapter folder to apply (orion lora writes one)")
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
                   help="print prefill ms, decode tokens/s, compiles and cache hits to stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orion

    prompt = args.prompt
    if prompt is None or prompt == "-":
        if sys.stdin.isatty():
            print("orion generate: error: give a prompt, or pipe one on stdin", file=sys.stderr)
            return 2
        # bytes, not text: bad UTF-8 becomes the API's typed error, not a decode crash
        stdin = getattr(sys.stdin, "buffer", None)
        prompt = (stdin.read().decode("utf-8", "surrogateescape") if stdin is not None
                  else sys.stdin.read())
    model_path = args.model
    if model_path is None:
        from orion.models.registry import default_model_path

        model_path = str(default_model_path())
    model, _ = orion.load(model_path, backend=args.backend,
                          **({"adapter_path": args.adapter_path} if args.adapter_path else {}))
    out = sys.stdout
    last = None
    ends_line = True   # whether stdout is at the start of a line
    try:
        for response in orion.stream_generate(
                model, prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop):
            if response.text:
                out.write(response.text)
                out.flush()
                ends_line = response.text.endswith("\n")
            last = response.stats
    except BaseException:
        if not ends_line:   # end the text's line, so that the error message starts its own
            try:
                out.write("\n")
                out.flush()
            except OSError:   # the reader left (a closed pipe): nothing to end
                pass
        raise
    finally:
        model.close()
    out.write("\n")
    out.flush()   # before the stats on stderr, so a terminal shows them in order
    if last is not None and last.cut_at_context:
        print(f"orion generate: output cut at the model's context ({model.max_length} "
              f"tokens): {last.generated_tokens} generated after a {last.prompt_tokens}-token "
              f"prompt, --max-tokens asked for {args.max_tokens}", file=sys.stderr)
    if args.stats and last is not None:
        print(last.summary(), file=sys.stderr)
    return 0
