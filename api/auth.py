"""API keys: ``--api-key`` makes every API route require one.

A request authenticates with ``Authorization: Bearer KEY`` (OpenAI clients) or
``x-api-key: KEY`` (Anthropic clients). Routes tagged ``opt={"public": True}`` (``/health``)
stay open. A refusal is a 401 rendered in the route's dialect (the guard runs after routing,
so the route's error renderer applies). Keys are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from mlxrt.errors import MlxrtError

__all__ = ["Unauthorized", "api_key_guard", "caller_of", "read_keys", "presented_key"]


class Unauthorized(MlxrtError):
    """The request carries no valid API key (401)."""

    status = 401
    type = "authentication_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_api_key")


def read_keys(keys: Iterable[str], files: Iterable[str | Path] = ()) -> list[str]:
    """The configured keys: given ones plus one per non-empty, non-``#`` line of each file.

    :raises ValueError: a key file cannot be read or holds no key.
    """
    out = [k.strip() for k in keys if k and k.strip()]
    for file in files:
        try:
            lines = Path(file).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read API key file {file}: {exc.strerror}") from None
        found = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not found:
            raise ValueError(f"API key file {file} holds no key")
        out += found
    return out


def presented_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The API key a request presents (``Authorization: Bearer`` or ``x-api-key``), if any."""
    auth = connection.headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = connection.headers.get("x-api-key")
    return key.strip() if key else None


def caller_of(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """Who is calling, for everything kept per caller (stored responses, prompt-cache entries):
    a SHA-256 digest of the API key the request authenticated with, so each key is its own
    partition and the key itself is never kept; ``""`` on a server without ``--api-key``
    (one partition: every client is trusted alike)."""
    if not connection.app.state.host.options.get("api_keys"):
        return ""
    return hashlib.sha256((presented_key(connection) or "").encode()).hexdigest()


def api_key_guard(
        keys: Sequence[str]) -> Callable[[ASGIConnection[Any, Any, Any, Any], BaseRouteHandler], Awaitable[None]]:
    """A guard admitting requests that present one of ``keys`` (a coroutine, so that Litestar
    runs it on the event loop rather than on a worker thread, as :func:`mlxrt.api.edge.edge_guard`)."""
    encoded = [k.encode() for k in keys]

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if handler.opt.get("public") or connection.scope.get("method") == "OPTIONS":
            return
        given = presented_key(connection)
        if given is None:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
        candidate = given.encode()
        # Every key is compared (no early exit), each in constant time.
        if not any([hmac.compare_digest(candidate, k) for k in encoded]):
            raise Unauthorized("invalid API key")

    return guard
