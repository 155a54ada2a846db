"""`orion serve [--model M] [--adapter-path NAME=DIR ...] [--host 127.0.0.1]
[--port 8080]`: the model, and LoRA adapters picked per request by `model`, behind an
OpenAI-compatible HTTP API (orion.serve; docs/serve.md). Without --model it serves
the shipped Shakespeare Llama."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

from orion.cli import speculative
from orion.errors import OrionError
from orion.extras import missing_extra


class ServeError(OrionError, ValueError):
    """`orion serve` cannot start as asked (a busy port, a bad option)."""


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
    p.add_argument("--batch-slots", type=int, default=8,
                   help="requests decoded together, a token each per step (continuous "
                   "batching; 8). 0: one request at a time, with the prompt cache")
    p.add_argument("--batch-context", type=int, default=None,
                   help="the most positions (prompt and answer) a batched request holds; "
                   "KV memory is slots x this (default: the model's context)")
    p.add_argument("--prefill-chunk", type=int, default=128,
                   help="a batched prompt goes in chunks between the running requests' "
                   "steps: its first this many tokens in one prefill, then 32 a chunk "
                   "(0: each prompt in one prefill, holding the other streams for it)")
    p.add_argument("--prompt-round-ms", type=int, default=250,
                   help="prompt work a batch runs before its next step while prompts wait "
                   "(250): more lets prompts arriving together in sooner, less keeps the "
                   "running streams' tokens coming more evenly (0: a chunk and a step in "
                   "turn)")
    p.add_argument("--prefix-cache-mb", type=int, default=256,
                   help="memory for prompt prefixes shared across batched requests: a "
                   "prompt past its first chunk keeps its keys and values up to its last "
                   "chunk cut, and a later prompt starting the same way loads them "
                   "(the answer is unchanged; 0: off)")
    speculative.add_flags(p)
    p.add_argument("--prompt-cache", choices=["auto", "always", "off"], default=None,
                   help="with --batch-slots 0: reuse the KV cache when a prompt extends "
                   "the previous one: when it is cheaper than a prefill by the model's "
                   "own timings (auto, the default), always, or off")
    p.add_argument("--backend", default=None, help="vane, ane or auto (default: the best)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="info (default) logs each request: method, path, status, tokens, "
                   "time; warning only problems; debug adds uvicorn's own log")
    p.set_defaults(func=run)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, for uvicorn to serve on. Bound here, before the model
    loads and before "serving on" is said, so that a busy port is one clear error (uvicorn
    would log it after the banner and exit 3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET   # as uvicorn binds
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(f"{host}:{port} is already in use (another server?); stop "
                             "it or pick another --port") from None
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def configure_logging(level: str) -> str:
    """Orion's log lines (a line per request at info) to stderr with a timestamp; the
    level uvicorn gets, which says its own start-up and shutdown lines only at debug."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger("orion")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
    return level if level in ("debug", "warning", "error", "critical") else "warning"


def _announcing_server(uvicorn: Any, config: Any, line: str) -> Any:
    """A uvicorn server that says `line` once it serves. By then uvicorn's signal
    handlers are in, so a Ctrl-C after the line is its orderly shutdown (exit 130).
    Said before, a Ctrl-C could land in uvicorn's start-up under Python's own handler,
    inside a lock: "cannot release un-acquired lock", exit 2."""

    class AnnouncingServer(uvicorn.Server):  # type: ignore[misc, name-defined]
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(line, file=sys.stderr, flush=True)

    return AnnouncingServer(config)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from orion.serve.app import create_app
    except ImportError as exc:
        raise missing_extra("serve", "orion serve", exc) from None
    adapters: dict[str, str] = {}
    for spec in args.adapter_path:
        adapter_name, sep, folder = spec.partition("=")
        if not sep or not adapter_name or not folder or adapter_name in adapters:
            raise ServeError(f"--adapter-path {spec!r}: give NAME=DIR, each NAME once")
        adapters[adapter_name] = folder
    if args.max_queue < 1 or not 0 <= args.port <= 65535:
        raise ServeError("--max-queue must be >= 1 and --port in [0, 65535]")
    from orion.models.batch import MAX_SLOTS

    if not 0 <= args.batch_slots <= MAX_SLOTS:
        raise ServeError(f"--batch-slots must be in [0, {MAX_SLOTS}]")
    if args.prefill_chunk < 0:
        raise ServeError(f"--prefill-chunk must be 0 or more, got {args.prefill_chunk}")
    if not 0 <= args.prompt_round_ms <= 60_000:
        raise ServeError(f"--prompt-round-ms must be in [0, 60000], got "
                         f"{args.prompt_round_ms}")
    if not 0 <= args.prefix_cache_mb <= 1 << 20:
        raise ServeError(f"--prefix-cache-mb must be in [0, {1 << 20}], got "
                         f"{args.prefix_cache_mb}")
    if args.batch_slots and args.prompt_cache not in (None, "off"):
        raise ServeError("--prompt-cache works with --batch-slots 0 (one request at a "
                         "time): a batching server prefills every prompt from position 0, "
                         "so no answer depends on the requests before it")
    if args.batch_slots and args.draft_model:
        raise ServeError("--draft-model works with --batch-slots 0 (one request at a "
                         "time): a draft model follows one sequence; a batching server "
                         "speculates by --speculative prompt")
    if args.api_key is not None and not args.api_key.strip():
        raise ServeError("--api-key is empty, which would turn authentication off; give "
                         "a key, or leave --api-key out")
    if not _loopback(args.host) and not args.api_key:
        print(f"orion serve: warning: binding {args.host}, which other machines can reach, "
              "with no authentication: anyone who can connect can use this model. Pass "
              "--api-key to require a key.", file=sys.stderr)
    import orion
    from orion.models.registry import default_model_path

    sock = listen_socket(args.host, args.port)
    try:
        path = args.model or str(default_model_path())
        model, _ = orion.load(path, backend=args.backend)
        draft = None
        try:
            spec, draft = speculative.options(args)
            if args.batch_slots:   # compiles, or opens from the program store: can take a while
                print(f"orion serve: preparing the batch programs ({args.batch_slots} slots)...",
                      file=sys.stderr, flush=True)
            name = args.served_model_name or Path(path.rstrip("/")).name or path
            app = create_app(model, name=name, max_queue=args.max_queue,
                             api_key=args.api_key, prompt_cache=args.prompt_cache or "auto",
                             adapters=adapters, batch_slots=args.batch_slots,
                             batch_context=args.batch_context,
                             prefill_chunk=args.prefill_chunk or None,
                             prefix_bytes=args.prefix_cache_mb << 20,
                             prompt_round_s=args.prompt_round_ms / 1000,
                             speculative=spec.get("speculative"),
                             draft_tokens=spec.get("draft_tokens"))
            port = sock.getsockname()[1]   # --port 0: the one the system picked
            worker = app.state.orion.worker
            slots = (f"{args.batch_slots} batch slots of {worker.context} positions, KV "
                     f"{worker.scheduler.batch.kv_bytes / 2**20:,.0f} MiB, shared "
                     f"prefixes up to {worker.scheduler.batch.prefixes.max_bytes >> 20} MiB"
                     if args.batch_slots else "one request at a time") + (
                         f", speculative: {args.draft_model or 'prompt lookup'}"
                         + (" while a request decodes alone" if args.batch_slots else "")
                         if spec else "")
            serving = (f"orion serve: {name} on http://{args.host}:{port}/v1 ({slots}, "
                       f"queue {args.max_queue}"
                       f"{', API key required' if args.api_key else ''})")
            # on Ctrl-C / SIGTERM, open streams get a few seconds to end, not forever;
            # uvicorn raises the signal again once shut down: Ctrl-C exits 130
            server = _announcing_server(uvicorn, uvicorn.Config(
                app, log_level=configure_logging(args.log_level), access_log=False,
                timeout_graceful_shutdown=5), serving)
            server.run(sockets=[sock])
            if not server.started:
                raise ServeError("the server did not start (its log above says why)")
        finally:
            if draft is not None:
                draft.close()
            model.close()
    finally:
        sock.close()
    return 0
