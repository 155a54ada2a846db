"""The OpenAI-compatible HTTP API on starlette (served by uvicorn; SSE by sse-starlette).

    GET  /health                 liveness and the queue
    GET  /v1/models              the base model and each LoRA adapter, by name
    POST /v1/completions         prompt -> text, streamed as server-sent events or not
    POST /v1/chat/completions    messages (through the chat template) -> text

Every client error is an OpenAI-style JSON error body with a 4xx status; anything
unexpected is a 500 with a generic body (the traceback goes to the server's log,
never to the client). Request bodies are bounded (size, nesting, digits of a number),
and no request field is ever used as a path. With an API key every /v1 route needs
`Authorization: Bearer KEY`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from orion.bounded_json import JSONInputError, loads
from orion.chat import ChatFormat, chat_format
from orion.errors import InvalidArgumentError, OrionError
from orion.models.base import CausalLM
from orion.serve.access_log import AccessLog, record
from orion.serve.batching import DEFAULT_PREFILL_CHUNK, PROMPT_ROUND_S
from orion.serve.errors import APIError, bad_request
from orion.serve.registry import ModelRegistry
from orion.serve.requests import (
    GenerationRequest,
    chat_request,
    completion_request,
    sampling_defaults,
)
from orion.serve.worker import Finished, Job, Options, Worker

log = logging.getLogger("orion.serve")
MAX_BODY_BYTES = 4 << 20
DISCONNECT_POLL_S = 0.25


class ServerState:
    """What the routes share: the model's worker, its names, its chat format."""

    def __init__(self, model: CausalLM, registry: ModelRegistry, worker: Worker) -> None:
        self.model, self.registry, self.worker = model, registry, worker
        self.chat: ChatFormat = chat_format(model.tokenizer)
        self.defaults = sampling_defaults(model.tokenizer.generation_defaults)
        self.created = int(time.time())


# ---- request plumbing --------------------------------------------------------------


async def _json_body(request: Request) -> Any:
    size = 0
    chunks = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:   # bounded: a 5000-digit number or a 100k-deep list is a 400, not a 500
        return loads(b"".join(chunks))
    except JSONInputError as exc:
        raise bad_request(f"the request body: {exc}") from None


def _usage(done: Finished) -> dict[str, Any]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def _prompt_ids(state: ServerState, req: GenerationRequest) -> tuple[list[int], tuple[str, ...]]:
    """Token ids of the request's prompt and the stop strings it runs with (runs in
    a thread: a long prompt must not stall the event loop)."""
    tokenizer, stops = state.model.tokenizer, tuple(req.stop)
    try:
        if req.chat:
            assert req.messages is not None
            ids = state.chat.prompt_ids(req.messages)
            stops += tuple(s for s in state.chat.stops if s not in stops)
        elif isinstance(req.prompt, str):
            ids = tokenizer.encode(req.prompt)
        else:
            assert req.prompt is not None
            if max(req.prompt) >= tokenizer.vocab_size or min(req.prompt) < 0:
                raise bad_request(f"token ids must be in [0, {tokenizer.vocab_size})", "prompt")
            ids = list(req.prompt)
    except (OrionError, ValueError) as exc:
        if isinstance(exc, APIError):
            raise
        raise bad_request(str(exc), "messages" if req.chat else "prompt") from None
    if not ids:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise bad_request("the prompt is empty", "prompt")
        ids = [eos]
    limit = state.worker.context
    if len(ids) >= limit:
        raise bad_request(f"the prompt is {len(ids)} tokens; this model's context is {limit} "
                          "tokens", "messages" if req.chat else "prompt",
                          code="context_length_exceeded")
    return ids, stops


async def _submit(state: ServerState, req: GenerationRequest) -> Job:
    target = state.registry.resolve(req.model)
    ids, stops = await run_in_threadpool(_prompt_ids, state, req)
    options = Options(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                      seed=req.seed, stop=stops)
    job = Job(target, ids, options, asyncio.get_running_loop())
    state.worker.submit(job)
    return job


async def _collect(request: Request, job: Job) -> tuple[str, Finished]:
    """The whole answer of a job; a client that disconnects meanwhile cancels it."""
    pieces = []
    try:
        while True:
            try:
                kind, value = await asyncio.wait_for(job.next_event(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise APIError(499, "the client closed the connection") from None
                continue
            if kind == "text":
                pieces.append(value)
            elif kind == "error":
                raise value
            else:
                return "".join(pieces), value
    except BaseException:
        job.cancel()
        raise


def _note(request: Request, done: Finished) -> None:
    """The finished job's counts, for the request's log line."""
    rec = record(request)
    rec.prompt_tokens, rec.completion_tokens = done.prompt_tokens, done.completion_tokens


async def _events(request: Request, job: Job,
                  chunk: Callable[[dict[str, Any], str | None], dict[str, Any]],
                  usage_chunk: Callable[[Finished], dict[str, Any]] | None,
                  first: dict[str, Any] | None = None) -> AsyncIterator[dict[str, str]]:
    """SSE events of a job: a chunk per text piece, a last chunk with finish_reason,
    an optional usage chunk, then [DONE]. Leaving early (the client disconnected)
    cancels the job."""
    try:
        if first is not None:
            yield {"data": json.dumps(chunk(first, None))}
        async for kind, value in job:
            if kind == "text":
                yield {"data": json.dumps(chunk({"content": value}, None))}
            elif kind == "error":
                yield {"data": json.dumps(value.body())}
                return
            else:
                _note(request, value)
                yield {"data": json.dumps(chunk({}, value.finish_reason))}
                if usage_chunk is not None:
                    yield {"data": json.dumps(usage_chunk(value))}
                yield {"data": "[DONE]"}
    finally:
        job.cancel()   # a no-op once done; frees the device at the next token otherwise


# ---- routes -----------------------------------------------------------------------


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.orion
    worker = state.worker
    ok = worker.alive
    return JSONResponse({"status": "ok" if ok else "error", "model": state.registry.base,
                         "busy": worker.live > 0, "running": worker.live,
                         "slots": worker.slots, "waiting": worker.waiting,
                         "tokens_per_s": round(worker.tokens_per_s(), 2),
                         "max_queue": worker.max_queue, "completed": worker.completed,
                         "cancelled": worker.cancelled,
                         "programs_compiled": state.model.stats.programs_compiled,
                         **({"speculative": {"drafted": worker.drafted,
                                             "accepted": worker.accepted,
                                             "declined": worker.declined}}
                            if worker.speculative is not None else {})},
                        status_code=200 if ok else 503)


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.orion
    data = [{"id": name, "object": "model", "created": state.created, "owned_by": "orion"}
            for name in state.registry.names()]
    return JSONResponse({"object": "list", "data": data})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.orion
    target = state.registry.resolve(request.path_params["name"])
    return JSONResponse({"id": target.name, "object": "model", "created": state.created,
                         "owned_by": "orion"})


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.orion
    req = completion_request(await _json_body(request), state.worker.context,
                             state.defaults)
    job = await _submit(state, req)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"id": rid, "object": "text_completion", "created": created,
                "model": job.target.name,
                "choices": [{"text": delta.get("content", ""), "index": 0, "logprobs": None,
                             "finish_reason": finish}]}

    def usage(done: Finished) -> dict[str, Any]:
        return {"id": rid, "object": "text_completion", "created": created,
                "model": job.target.name, "choices": [], "usage": _usage(done)}

    if req.stream:
        return EventSourceResponse(_events(request, job, chunk,
                                           usage if req.include_usage else None))
    text, done = await _collect(request, job)
    _note(request, done)
    body = chunk({"content": text}, done.finish_reason)
    body["usage"] = _usage(done)
    return JSONResponse(body)


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.orion
    req = chat_request(await _json_body(request), state.worker.context, state.defaults)
    job = await _submit(state, req)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"id": rid, "object": "chat.completion.chunk", "created": created,
                "model": job.target.name,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}

    def usage(done: Finished) -> dict[str, Any]:
        return {"id": rid, "object": "chat.completion.chunk", "created": created,
                "model": job.target.name, "choices": [], "usage": _usage(done)}

    if req.stream:
        return EventSourceResponse(_events(request, job, chunk,
                                           usage if req.include_usage else None,
                                           first={"role": "assistant", "content": ""}))
    text, done = await _collect(request, job)
    _note(request, done)
    return JSONResponse({
        "id": rid, "object": "chat.completion", "created": created, "model": job.target.name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": done.finish_reason}],
        "usage": _usage(done)})


# ---- errors and auth ----------------------------------------------------------------


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(APIError(exc.status_code, str(exc.detail), type=kind).body(),
                        status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(APIError(500, "the server failed on this request",
                                 type="server_error").body(), status_code=500)


class BearerAuth:
    """ASGI middleware: every route but /health needs `Authorization: Bearer <key>`
    (the scheme in any case, as RFC 7235 has it: `bearer KEY` too)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key.strip():
            raise InvalidArgumentError("an empty API key would let every request in")
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/health":
            headers = dict(scope.get("headers") or [])
            scheme, _, given = headers.get(b"authorization", b"").strip().partition(b" ")
            if not (scheme.lower() == b"bearer"
                    and hmac.compare_digest(given.strip(), self.key)):
                response = JSONResponse(
                    APIError(401, "a valid 'Authorization: Bearer <api key>' header is "
                             "required", type="authentication_error",
                             code="invalid_api_key").body(), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(model: CausalLM, *, name: str, max_queue: int = 16,
               api_key: str | None = None, prompt_cache: str = "auto",
               adapters: dict[str, str] | None = None, batch_slots: int = 0,
               batch_context: int | None = None,
               prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
               prefix_bytes: int = 0, speculative: object = None,
               draft_tokens: int | None = None,
               prompt_round_s: float = PROMPT_ROUND_S) -> Starlette:
    """The server's ASGI app around a loaded model. Its worker thread starts with the
    app (lifespan) and stops with it. `adapters` (name -> PEFT adapter folder, given by
    the operator) are loaded into the model here; a request picks one by `model`.
    `batch_slots` > 0 decodes up to that many requests together (`BatchWorker`; the
    model must be a `TransformerLM`), each slot holding `batch_context` positions
    (None: the model's context), each prompt going in by chunks of `prefill_chunk`
    tokens first (None: one prefill) between the steps, with `prefix_bytes` for
    prefixes shared across slots and `prompt_round_s` of prompt work between two
    steps; 0 runs one request at a time with the prompt cache
    (`prompt_cache`). Given `speculative` ("prompt" or a draft model) and
    `draft_tokens`, the requests without an adapter decode speculatively: one at a
    time, or with batch slots by prompt lookup while a request decodes alone
    (`orion.serve.batch_worker`)."""
    registry = ModelRegistry(name, adapters)
    for adapter_name, folder in registry.adapters.items():
        model.load_adapter(folder, adapter_name)
    worker: Worker
    if batch_slots:
        from orion.serve.batch_worker import BatchWorker

        worker = BatchWorker(model, max_queue=max_queue, slots=batch_slots,
                             context=batch_context, prefill_chunk=prefill_chunk,
                             prefix_bytes=prefix_bytes, prompt_round_s=prompt_round_s,
                             speculative=speculative, draft_tokens=draft_tokens)
    else:
        worker = Worker(model, max_queue=max_queue, prompt_cache=prompt_cache,
                        speculative=speculative, draft_tokens=draft_tokens)
    state = ServerState(model, registry, worker)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(worker.stop)

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        APIError: _api_error, HTTPException: _http_error, Exception: _server_error}
    app = Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{name:path}", get_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ], exception_handlers=handlers, lifespan=lifespan)
    app.state.orion = state
    if api_key is not None:   # "" is refused there, never taken as "no key"
        app.add_middleware(BearerAuth, api_key=api_key)
    app.add_middleware(AccessLog)   # added last: outermost, so a 401 is logged too
    return app

