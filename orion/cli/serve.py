"""`orion serve [--model M] [--adapter-path NAME=DIR ...] [--host 127.0.0.1]
[--port 8080]`: the model, and LoRA adapters picked per request by `model`, behind an
OpenAI-compatible HTTP API (orion.serve; docs/serve.md). Without --model it serves
the shipped Shakespeare Llama."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model (as for `orion generate --model`) at /v1/completions, "
        "/v1/chat/completions, /v1/models and /health. Requests run one at a time on the "
        "device; up to --max-queue wait, more get 429. Needs the `serve` extra.")
    p.add_argument("--model", "-m", default=None,
                   help="model folder, file or repo id (default: the shipped Shakespeare "
                   "Llama)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients pass as 'model' (default: the folder's name)")
    p.add_argument("--adapter-path", action="append", default=[], metavar="NAME=DIR",
                   help="a PEFT LoRA adapter folder served as NAME: a request picks it with "
                   "'model': NAME (or BASE:NAME); repeatable")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (8080)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every /v1 request (an "
                   "empty key is refused, not taken as no key)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests that may wait while one runs; more get 429 (16)")
    p.add_argument("--prompt-cache", choices=["auto", "always", "off"], default="auto",
                   help="reuse the KV cache when a prompt extends the previous one: when "
                   "it is cheaper than a prefill by the model's own timings (auto), "
                   "always, or off")
    p.add_argument("--backend", default=None, help="vane, ane or auto (default: the best)")
    p.add_argument("--log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (warning)")
    p.set_defaults(func=run)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from orion.serve.app import create_app
    except ImportError as exc:
        print(f"orion serve: error: {exc.name} is missing; install the server with "
              "pip install 'orion-ane[serve]'", file=sys.stderr)
        return 1
    adapters: dict[str, str] = {}
    for spec in args.adapter_path:
        adapter_name, sep, folder = spec.partition("=")
        if not sep or not adapter_name or not folder or adapter_name in adapters:
            print(f"orion serve: error: --adapter-path {spec!r}: give NAME=DIR, each NAME "
                  "once", file=sys.stderr)
            return 2
        adapters[adapter_name] = folder
    if args.max_queue < 1 or not 0 <= args.port <= 65535:
        print("orion serve: error: --max-queue must be >= 1 and --port in [0, 65535]",
              file=sys.stderr)
        return 2
    if args.api_key is not None and not args.api_key.strip():
        print("orion serve: error: --api-key is empty, which would turn authentication "
              "off; give a key, or leave --api-key out", file=sys.stderr)
        return 2
    if not _loopback(args.host) and not args.api_key:
        print(f"orion serve: warning: binding {args.host}, which other machines can reach, "
              "with no authentication: anyone who can connect can use this model. Pass "
              "--api-key to require a key.", file=sys.stderr)
    import orion
    from orion.models.llama import default_model_path

    path = args.model or str(default_model_path())
    try:
        model, _ = orion.load(path, backend=args.backend)
    except (ValueError, OSError) as exc:
        print(f"orion serve: error: {exc}", file=sys.stderr)
        return 1
    name = args.served_model_name or Path(path.rstrip("/")).name or path
    try:
        app = create_app(model, name=name, max_queue=args.max_queue, api_key=args.api_key,
                         prompt_cache=args.prompt_cache, adapters=adapters)
    except (ValueError, OSError) as exc:
        model.close()
        print(f"orion serve: error: {exc}", file=sys.stderr)
        return 1
    print(f"orion serve: {name} on http://{args.host}:{args.port}/v1 "
          f"(queue {args.max_queue}{', API key required' if args.api_key else ''})",
          file=sys.stderr, flush=True)
    try:
        # on Ctrl-C / SIGTERM, open streams get a few seconds to end, not forever
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    access_log=False, timeout_graceful_shutdown=5)
    finally:
        model.close()
    return 0
