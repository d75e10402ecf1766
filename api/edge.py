"""What a request must show before any handler runs: the checks that keep web pages out.

A key-less server on loopback is reachable from every page the user's browser opens. Three
things keep those pages from using it (issue 22, docs/operators.md "Security model"):

* **Host.** DNS rebinding points ``attacker.example`` at 127.0.0.1, so the browser calls the
  server as a same-origin site. The ``Host`` header then still names the attacker: only the
  names in ``--allowed-hosts`` (default on loopback: ``localhost``, ``127.0.0.1``, ``::1`` and
  the bound address) are served; any other gets 421.
* **Content-Type.** Browsers send ``text/plain`` / form bodies cross-origin without asking
  (no CORS preflight); ``application/json`` always needs a preflight, which CORS (off by
  default) refuses. So a body-carrying request to a JSON route must say JSON (415 otherwise).
* **State-changing routes** (adapter mount/unmount, deletes: anything not a GET and not an
  inference POST) refuse a browser's request, one whose ``Origin`` is not the server's own or
  an origin listed in ``--allowed-origins`` (``*`` does not count), or that says
  ``Sec-Fetch-Site: cross-site``/``same-site``, unless API keys are set (a page cannot know
  the key). Bound to loopback, the server's own origin is any loopback name on its port
  (``http://localhost:PORT``, ``http://127.0.0.1:PORT``, ``http://[::1]:PORT``), whichever
  name the page was opened under. A state-changing GET (a route that opts in) needs more: a
  browser that sends neither ``Origin`` nor Fetch Metadata cannot be told from a plain
  client, so such a GET must prove it comes from the server's own page (its own or a listed
  ``Origin``, or ``Sec-Fetch-Site: same-origin``/``none``); plain clients use the route's POST.

Routes opt out with ``opt={"json_body": False}`` (a route that reads another body type) and
``opt={"state_changing": False}`` (a non-GET route that changes nothing); a GET that acts
(starts a job) opts in with ``opt={"state_changing": True}``. The checks are a
Litestar guard: a few header lookups per request, nothing per streamed chunk, and a refusal is
a typed error rendered in the route's dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from mlxrt.errors import MlxrtError

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = ["EdgePolicy", "HostNotAllowed", "UnsupportedMediaType", "BrowserRefused", "PluginUnavailable",
           "edge_guard", "is_loopback", "loopback_hosts", "own_origins", "parse_hosts", "is_json_media_type",
           "method_semantics", "HEAD_KEY"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Set in the ASGI scope of a HEAD request answered as a GET (:func:`method_semantics`).
HEAD_KEY = "mlxrt.head"


class HostNotAllowed(MlxrtError):
    """The ``Host`` header names a host this server does not serve (421: DNS rebinding guard)."""

    status = 421
    type = "invalid_request_error"

    def __init__(self, host: str, allowed: Iterable[str]) -> None:
        super().__init__(f"Host {host!r} is not served here (DNS-rebinding guard); allowed: "
                         f"{', '.join(sorted(allowed))}. Add names with --allowed-hosts "
                         "(or --allowed-hosts '*' to turn the check off).", code="host_not_allowed")


class UnsupportedMediaType(MlxrtError):
    """A JSON route got a body that does not say it is JSON (415)."""

    status = 415
    type = "invalid_request_error"

    def __init__(self, given: str | None) -> None:
        got = f"got {given!r}" if given else "none was sent"
        super().__init__(f"Content-Type must be application/json ({got})", code="unsupported_media_type")


class BrowserRefused(MlxrtError):
    """A browser page of another origin asked for a state-changing route on a key-less server."""

    status = 403
    type = "permission_error"

    def __init__(self, origin: str | None, *, unproven: bool = False) -> None:
        if unproven:
            super().__init__("this GET changes server state and the server has no API key: it is served to the "
                             "server's own pages only (Origin or Sec-Fetch-Site: same-origin); other clients use "
                             "POST on the same path", code="cross_origin_refused")
            return
        who = f"origin {origin!r}" if origin else "a cross-site page"
        super().__init__(f"{who} may not call this route: it changes server state and the server has no "
                         "API key. List the origin in --allowed-origins or start the server with --api-key.",
                         code="cross_origin_refused")


class PluginUnavailable(MlxrtError):
    """The route's plugin failed at start (its ``mlxrt_startup`` raised), so it does not serve."""

    status = 503
    type = "service_unavailable"

    def __init__(self, plugin: str, error: str | None) -> None:
        super().__init__(f"plugin {plugin!r} failed at start and does not serve this route: {error}",
                         code="plugin_failed")


def parse_hosts(values: Iterable[str]) -> list[str]:
    """``--allowed-hosts`` values (repeatable, each may be a comma list) → names."""
    return [part.strip().lower() for value in values for part in value.split(",") if part.strip()]


def loopback_hosts(bind: str | None) -> list[str]:
    """The names a loopback-bound server answers to: the loopback names and the bound address."""
    names = list(LOOPBACK_NAMES)
    if bind and bind.lower() not in names:
        names.append(bind.lower())
    return names


def is_json_media_type(value: str | None) -> bool:
    """``application/json`` or any ``*/*+json`` type, parameters (``charset``) allowed."""
    if not value:
        return False
    kind = value.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.endswith("+json") and "/" in kind)


def _hostname(header: str) -> str:
    """The host of a ``Host`` header (``[::1]:8080`` → ``::1``, ``a.b:80`` → ``a.b``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


@attrs.frozen
class EdgePolicy:
    """The edge checks of one app (built once, from the serve options).

    :ivar hosts: Host names served; ``None`` turns the check off (``--allowed-hosts '*'``, or a
        server bound to a non-loopback address without ``--allowed-hosts``).
    :ivar origins: Origins listed in ``--allowed-origins`` (``*`` left out): pages allowed to
        call state-changing routes.
    :ivar keyed: API keys are required; state-changing routes then trust the key, not the origin.
    :ivar own: The server's own origins besides ``scheme://Host``: bound to loopback, each
        loopback name on the served port (a page opened at ``localhost`` calling ``127.0.0.1``).
    """

    hosts: frozenset[str] | None
    origins: frozenset[str] = frozenset()
    keyed: bool = False
    own: frozenset[str] = frozenset()

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> EdgePolicy:
        given = list(options.get("allowed_hosts") or ())
        bind = options.get("host")
        if "*" in given:
            hosts = None
        elif given:
            hosts = frozenset(given)
        elif is_loopback(bind):
            hosts = frozenset(loopback_hosts(bind))
        else:
            hosts = None  # reachable by any name the operator gave it: --allowed-hosts to check
        origins = frozenset(o.rstrip("/").lower() for o in options.get("cors_origins") or () if o != "*")
        return cls(hosts=hosts, origins=origins, keyed=bool(options.get("api_keys")),
                   own=own_origins(bind, options.get("port")))


def own_origins(bind: str | None, port: Any) -> frozenset[str]:
    """The origins of the server's own pages under every loopback name (``http://localhost:PORT``,
    ``http://127.0.0.1:PORT``, ``http://[::1]:PORT``, the bound address): none unless it is
    bound to loopback on a known port (no other machine can serve those origins)."""
    if not is_loopback(bind) or not isinstance(port, int) or not 0 < port < 65536:
        return frozenset()
    names = {"localhost", "127.0.0.1", "[::1]", *([f"[{bind}]" if ":" in bind else bind] if bind else [])}
    return frozenset(f"http://{name}" + ("" if port == 80 else f":{port}") for name in names)


def is_loopback(bind: str | None) -> bool:
    """Whether the bind address is loopback only (no other machine can connect)."""
    return bind in (None, "localhost", "::1") or str(bind).startswith("127.")


def _state_changing(method: str, opt: dict[str, Any]) -> bool:
    if "state_changing" in opt:  # a route's own word wins (a GET that starts a job says so)
        return bool(opt["state_changing"]) and method != "OPTIONS"
    if method in _SAFE_METHODS:
        return False
    # Inference POSTs (a dialect route) read and answer; DELETE/PUT/PATCH and other POSTs act.
    return method != "POST" or "dialect" not in opt


def edge_guard(policy: EdgePolicy, host: PluginHost, owners: dict[tuple[str, str], str] | None = None) -> Any:
    """The Litestar guard enforcing ``policy``; it also refuses (503) the routes whose plugin
    (``owners``: ``(method, path template)`` → plugin) failed at start."""
    owners = owners or {}

    # A coroutine although it never awaits: Litestar runs a plain-function guard on a worker
    # thread (its sync_to_thread), a thread hop per request and a pool of threads for checks
    # that take microseconds.
    async def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        headers = connection.headers
        host_header = headers.get("host", "")
        if policy.hosts is not None and _hostname(host_header) not in policy.hosts:
            raise HostNotAllowed(_hostname(host_header), policy.hosts)
        opt = handler.opt
        method = str(connection.scope.get("method", "GET"))  # a websocket's scope has none
        if connection.scope.get(HEAD_KEY) and opt.get("state_changing"):  # HEAD never acts
            from litestar.exceptions import MethodNotAllowedException

            raise MethodNotAllowedException(headers={"allow": "GET, OPTIONS"})
        plugin = owners.get((method, connection.scope.get("path_template", "")))
        if plugin is not None:
            record = host.records.get(plugin)
            if record is not None and record.status == "failed":
                raise PluginUnavailable(plugin, record.error)
        if method in _BODY_METHODS and opt.get("json_body", True):
            content_type = headers.get("content-type")
            if not is_json_media_type(content_type):
                raise UnsupportedMediaType(content_type)
        if not policy.keyed and _state_changing(method, opt):
            _refuse_browsers(headers, host_header, policy, proof=method in _SAFE_METHODS)

    return guard


def _refuse_browsers(headers: Any, host_header: str, policy: EdgePolicy, *, proof: bool = False) -> None:
    """Refuse a page of another origin. ``proof``: a GET that acts must also show it is not one
    (an old browser sends neither ``Origin`` nor ``Sec-Fetch-Site`` on a cross-site GET)."""
    origin = headers.get("origin")
    if origin is not None:
        origin = origin.strip().rstrip("/").lower()
        # The server's own pages (plugins/pages) send their own origin: scheme://Host.
        own = origin.partition("://")[2] == host_header.strip().lower() or origin in policy.own
        if not own and origin not in policy.origins:
            raise BrowserRefused(origin)
        return
    site = headers.get("sec-fetch-site", "").lower()
    if site in ("cross-site", "same-site"):
        raise BrowserRefused(None)
    if proof and site not in ("same-origin", "none"):
        raise BrowserRefused(None, unproven=True)



def method_semantics(handler: Any, routes: Callable[[], Iterable[Any]]) -> Any:
    """Wrap the app's ASGI handler (:func:`mlxrt.compat.wrap_litestar_handler`) for two HTTP
    rules Litestar leaves out:

    * ``HEAD`` answers where ``GET`` does (RFC 9110): the request is routed as a GET (a GET
      that acts, ``opt={"state_changing": True}``, refuses it: 405) and the body is dropped;
    * ``Allow`` (on an ``OPTIONS`` answer and a 405) lists every method of the path, ``HEAD``
      beside ``GET``: Litestar's automatic ``OPTIONS`` answer named only the methods of the
      first handler registered on a path (``GET`` of ``/v1/adapters``, not its ``POST``).

    ``routes`` gives the app's routes (``app.routes``), read once, on first use.
    """
    methods: dict[str, frozenset[str]] = {}

    def route_methods(template: str) -> frozenset[str]:
        if not methods:
            for route in routes():
                known = set(getattr(route, "methods", ()) or ())
                path = getattr(route, "path_format", route.path)  # what routing puts in path_template
                known |= methods.get(path, frozenset())  # a path may have several routes
                methods[path] = frozenset(known | ({"HEAD"} if "GET" in known else set()))
        return methods.get(template, frozenset())

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await handler(scope, receive, send)
            return
        head = scope.get("method") == "HEAD"
        if head:
            scope = {**scope, "method": "GET", HEAD_KEY: True}
        state = {"ended": False}

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                allow = [v for k, v in headers if k.lower() == b"allow"]
                if allow:
                    listed = {m.strip() for m in allow[0].decode("latin-1").split(",") if m.strip()}
                    listed |= route_methods(scope.get("path_template", ""))
                    if "GET" in listed:
                        listed.add("HEAD")
                    headers = [(k, v) for k, v in headers if k.lower() != b"allow"]
                    headers.append((b"allow", ", ".join(sorted(listed)).encode()))
                    message = {**message, "headers": headers}
            elif head and message["type"] == "http.response.body":
                if state["ended"]:
                    return  # the rest of a GET's body: a HEAD answer has none
                state["ended"] = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await handler(scope, receive, sending)

    return wrapped
