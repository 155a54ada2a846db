"""OpenAI-style errors: every failure a client can cause is an `APIError` with an
HTTP status and a body shaped as the OpenAI API's:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "n",
               "code": null}}
"""

from __future__ import annotations

from typing import Any

from orion.errors import OrionError


class APIError(OrionError):
    """A request the server refuses, with the status and body to answer it with."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)
