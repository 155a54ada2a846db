"""One line per HTTP request on the `orion.serve` logger at INFO, as llama-server and
mlx_lm.server log theirs: method, path, status, the generation's tokens (prompt +
completion) and the wall time until the response's last byte (a stream's included).

    "POST /v1/chat/completions" 200 prompt 31 + completion 24 tokens 1.27 s (127.0.0.1)

The routes put the token counts in the request's `RequestRecord` (`record(request)`);
requests that generate nothing (/health, a 4xx) log no tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("orion.serve")
SCOPE_KEY = "orion.request_record"


@dataclass
class RequestRecord:
    """What a route learned about its request, for the log line."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def record(request: Request) -> RequestRecord:
    """The request's record (a fresh one when the app runs without AccessLog)."""
    return request.scope.setdefault(SCOPE_KEY, RequestRecord())


def request_line(method: str, path: str, status: int, rec: RequestRecord, seconds: float,
                 client: Any = None) -> str:
    tokens = (f" prompt {rec.prompt_tokens} + completion {rec.completion_tokens} tokens"
              if rec.prompt_tokens is not None else "")
    who = f" ({client[0]})" if client else ""
    return f'"{method} {path}" {status}{tokens} {seconds:.2f} s{who}'


class AccessLog:
    """ASGI middleware: logs each HTTP request once its response has ended (or failed:
    an exception the app raises is logged as 500, then passed on)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rec = scope.setdefault(SCOPE_KEY, RequestRecord())
        start = time.perf_counter()
        status = 500   # until the app says otherwise

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if log.isEnabledFor(logging.INFO):
                log.info("%s", request_line(scope.get("method", "?"), scope.get("path", "?"),
                                            status, rec, time.perf_counter() - start,
                                            scope.get("client")))
