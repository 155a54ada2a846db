"""What a request's `model` field names: the base model, or a LoRA adapter over it.

An adapter is named by the NAME it was served with (`orion serve --adapter-path
NAME=DIR`), or as "BASE:NAME". `resolve(name)` gives a `Target(base, adapter)`; the
worker selects that adapter (None: the base model) for the request alone. An unknown
name is a 404 `model_not_found`.
"""

from __future__ import annotations

from dataclasses import dataclass

from orion.errors import InvalidArgumentError
from orion.serve.errors import APIError


@dataclass(frozen=True)
class Target:
    """base: the served model's name; adapter: an adapter name, or None for the base."""

    base: str
    adapter: str | None = None

    @property
    def name(self) -> str:
        return self.adapter or self.base


class ModelRegistry:
    """The names a server answers to (GET /v1/models lists them)."""

    def __init__(self, base: str, adapters: dict[str, str] | None = None) -> None:
        self.base = base
        self.adapters = dict(adapters or {})   # name -> adapter folder (for LoRA)
        if base in self.adapters:
            raise InvalidArgumentError(f"adapter name {base!r} is the base model's name")

    def names(self) -> list[str]:
        return [self.base, *self.adapters]

    def resolve(self, name: object) -> Target:
        if not isinstance(name, str) or not name:
            raise APIError(400, "'model' must be a model name (GET /v1/models lists them)",
                           param="model")
        if name == self.base:
            return Target(self.base)
        if name in self.adapters:
            return Target(self.base, name)
        base, _, adapter = name.rpartition(":")
        if base == self.base and adapter in self.adapters:
            return Target(self.base, adapter)
        raise APIError(404, f"The model '{name}' does not exist; this server has "
                       f"{', '.join(repr(n) for n in self.names())}",
                       type="invalid_request_error", param="model", code="model_not_found")
