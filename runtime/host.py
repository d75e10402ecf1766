"""Building the plugin host: loads ``mlxrt`` entry points one by one and isolates failures.

There is no module-level plugin manager. :func:`make_host` builds a fresh
:class:`~mlxrt.registry.PluginHost` (tests call it with explicit plugins); the CLI builds one
after parsing its arguments, so a blocked plugin is never imported and a broken one cannot lock
a user out of ``mlxrt plugins``. The host is the plugin registry only: it imports nothing of the
model pool, the serving layer or the engine (they import it).
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import pluggy

from mlxrt import hookspecs
from mlxrt.records import PluginRecord
from mlxrt.registry import FAMILY_HOOKS, PluginHost

__all__ = ["PluginHost", "make_host", "FAMILY_HOOKS", "ENTRY_POINT_GROUP"]

log = logging.getLogger("mlxrt.host")

ENTRY_POINT_GROUP = "mlxrt"
_BUILTIN_DIST = "mlxrt"


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return [part.strip() for part in raw.split(",") if part.strip()]


def _discover() -> list[tuple[md.EntryPoint, str | None, str | None]]:
    """The ``mlxrt`` entry points, built-ins first, each with its distribution's name and
    version (``None`` for an entry point without one). Each distribution's metadata is read
    once: ``Distribution.name`` and ``.version`` parse its whole METADATA file at every call
    (~1 ms each, ~70 calls at a server's start before this)."""
    about: dict[int, tuple[str, str]] = {}
    seen: set[tuple[str, str]] = set()
    found: list[tuple[md.EntryPoint, str | None, str | None]] = []
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        dist = version = None
        if ep.dist is not None:
            if id(ep.dist) not in about:
                meta = ep.dist.metadata
                about[id(ep.dist)] = (meta["Name"], meta["Version"])
            dist, version = about[id(ep.dist)]
        if (_normalize(dist or ""), ep.name) in seen:
            continue  # the same distribution seen twice on sys.path
        seen.add((_normalize(dist or ""), ep.name))
        found.append((ep, dist, version))
    found.sort(key=lambda item: (not _is_builtin(item[1]), item[0].name))
    return found


def _is_builtin(dist: str | None) -> bool:
    return dist is not None and _normalize(dist) == _BUILTIN_DIST


def make_host(
    *,
    entry_points: bool = True,
    only: Collection[str] | None = None,
    disable: Collection[str] = (),
    extra: Sequence[object | tuple[str, object]] = (),
    options: Mapping[str, Any] | None = None,
    loader: Callable[[md.EntryPoint], object] | None = None,
) -> PluginHost:
    """Build a plugin host.

    :param entry_points: Load plugins from the ``mlxrt`` entry-point group.
    :param only: Load only these entry-point names (env ``MLXRT_LOAD_PLUGINS``; an empty value
        means built-ins only).
    :param disable: Names never imported (``--disable-plugin``; env ``MLXRT_DISABLE_PLUGINS``).
    :param extra: Plugins to register directly, as objects or ``(name, object)`` pairs (tests).
    :param options: Serve options, readable by plugins as ``host.options``.
    :param loader: How an entry point is imported (default ``EntryPoint.load``).
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    strict = os.environ.get("MLXRT_STRICT_PLUGINS") == "1"
    host = PluginHost(pm=pm, options=dict(options or {}), strict=strict)
    blocked = set(disable) | set(_env_list("MLXRT_DISABLE_PLUGINS") or ())
    env_only = _env_list("MLXRT_LOAD_PLUGINS")
    if only is None and env_only is not None:
        only = env_only
    if os.environ.get("MLXRT_TRACE_HOOKS") == "1":
        pm.add_hookcall_monitoring(
            lambda name, impls, kw: log.debug("hook %s → %s", name, [i.plugin_name for i in impls]),
            lambda outcome, name, impls, kw: None,
        )

    if entry_points:
        for ep, dist, version in _discover():
            builtin = _is_builtin(dist)
            if ep.name in blocked:
                pm.set_blocked(ep.name)
                host.records[ep.name] = PluginRecord(name=ep.name, dist=dist, version=version,
                                                     kind="?", status="disabled", builtin=builtin)
                continue
            if only is not None and not builtin and ep.name not in only:
                continue
            try:
                plugin = (loader or md.EntryPoint.load)(ep)
            except Exception as exc:  # plugin boundary: a broken plugin never takes the host down
                if strict:
                    raise
                host._fail(ep.name, dist, version, f"{type(exc).__name__}: {exc}", builtin)
                continue
            record = host.register(plugin, ep.name, dist=dist, version=version, builtin=builtin)
            if strict and record.status == "failed":
                raise RuntimeError(f"plugin {ep.name} failed: {record.error}")

    for item in extra:
        name, plugin = item if isinstance(item, tuple) else (None, item)
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if name in blocked:
            continue
        host.register(plugin, name)
    return host
