"""The plugin registry: which plugins are loaded, what each implements, and calling their hooks
with provenance (which plugin answered, a plugin's fault reported under its name).

A :class:`PluginHost` knows plugins, their options and their state; it knows no model. A hook
about one model is told that model as its ``model`` argument (:class:`mlxrt.serving.ServedModel`)
by whoever calls it; routes get a request's model from :func:`mlxrt.api.models.model_for`.
Building one from the ``mlxrt`` entry points is :func:`mlxrt.host.make_host`'s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import pluggy

from mlxrt.errors import MlxrtError, PluginError
from mlxrt.records import PluginRecord, RequestField

__all__ = ["PluginHost", "FAMILY_HOOKS"]

log = logging.getLogger("mlxrt.host")

#: The hooks called once per model load (a plugin implementing one is listed as a family);
#: per-request hooks such as ``mlxrt_chat_template_kwargs`` do not make a plugin a family.
FAMILY_HOOKS = frozenset(
    {
        "mlxrt_load_model",
        "mlxrt_tool_parser",
        "mlxrt_tool_prompt",
        "mlxrt_tool_stream_mode",
        "mlxrt_thinking_format",
        "mlxrt_vision",
    }
)
_SAMPLER_HOOKS = frozenset({"mlxrt_sampler", "mlxrt_logits_processors", "mlxrt_request_fields"})


@attrs.define
class PluginHost:
    """The plugin manager plus what the host knows about each plugin: the registry, and nothing
    about models (which model a hook is about is its ``model`` argument).

    :ivar pm: The pluggy manager (project ``mlxrt``), hookspecs added.
    :ivar records: One :class:`PluginRecord` per plugin seen, in load order.
    :ivar options: Values of ``mlxrt serve`` options, by name (plugins read their own here).
    :ivar route_conflicts: Routes skipped because another plugin claimed them first.
    :ivar field_claims: Request fields claimed by plugins, per dialect (see ``mlxrt_request_fields``
        and :meth:`request_fields`).
    :ivar plugin_states: What plugins keep for the host's lifetime (see :meth:`plugin_state`).
    :ivar strict: ``MLXRT_STRICT_PLUGINS=1``: a plugin failure is an error, not a skipped plugin.
    """

    pm: pluggy.PluginManager
    records: dict[str, PluginRecord] = attrs.field(factory=dict)
    options: dict[str, Any] = attrs.field(factory=dict)
    route_conflicts: list[str] = attrs.field(factory=list)
    field_claims: dict[str, dict[str, RequestField]] = attrs.field(factory=dict)
    plugin_states: dict[str, Any] = attrs.field(factory=dict)
    strict: bool = False
    _state_lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)
    _field_owners: dict[tuple[str, str], str] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def plugin_state(self, name: str, make: Callable[[], Any]) -> Any:
        """The object plugin ``name`` keeps for as long as this host lives (a cache, a
        store), made by ``make()`` on first use. Plugins keep state here instead of in module
        globals: one process may hold several hosts (tests do), each with its own plugins."""
        with self._state_lock:
            if name not in self.plugin_states:
                self.plugin_states[name] = make()
            return self.plugin_states[name]

    def request_fields(self, dialect: str) -> dict[str, RequestField]:
        """The body fields plugins claim for ``dialect`` (``mlxrt_request_fields``), merged; a
        bare type is a :class:`~mlxrt.records.RequestField` without a check. Collected once per
        dialect; two plugins claiming one field is a :class:`PluginError`."""
        if dialect not in self.field_claims:
            merged: dict[str, RequestField] = {}
            owners: dict[str, str] = {}
            for plugin, mapping in self.collect("mlxrt_request_fields", dialect=dialect):
                for name, claim in dict(mapping).items():
                    if name in merged:
                        raise PluginError(plugin, "mlxrt_request_fields",
                                          ValueError(f"field {name!r} is already claimed by plugin {owners[name]}"))
                    merged[name] = claim if isinstance(claim, RequestField) else RequestField(claim)
                    owners[name] = self._field_owners[dialect, name] = plugin
            self.field_claims[dialect] = merged
        return self.field_claims[dialect]

    def check_request_fields(self, dialect: str, extra: Mapping[str, Any]) -> None:
        """Run the checks of the claimed fields ``extra`` sets (a bad value raises the client's
        :class:`~mlxrt.errors.InvalidRequest`; any other exception is the plugin's)."""
        if not extra:
            return
        for name, claim in self.request_fields(dialect).items():
            if claim.validate is not None and name in extra:
                try:
                    claim.validate(extra[name])
                except MlxrtError:
                    raise
                except Exception as exc:  # plugin boundary
                    owner = self._field_owners.get((dialect, name), "?")
                    raise PluginError(owner, "mlxrt_request_fields", exc) from exc

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def plugin(self, name: str) -> PluginRecord:
        """The record of plugin ``name``; ``KeyError`` when the host never saw it."""
        return self.records[name]

    def loaded(self) -> list[PluginRecord]:
        return [r for r in self.records.values() if r.status == "loaded"]

    def failed(self) -> list[PluginRecord]:
        return [r for r in self.records.values() if r.status == "failed"]

    def register(
        self,
        plugin: object,
        name: str,
        *,
        dist: str | None = None,
        version: str | None = None,
        builtin: bool = False,
    ) -> PluginRecord:
        """Register ``plugin`` under ``name`` and record it; failures are recorded, not raised."""
        if name in self.records and self.records[name].status == "loaded":
            other = self.records[name].dist or "an explicit plugin"
            return self._fail(name, dist, version, f"duplicate name, also provided by {other}",
                              builtin, replace=False)
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as exc:  # plugin boundary: record and skip
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            return self._fail(name, dist, version, f"{type(exc).__name__}: {exc}", builtin)
        hooks = tuple(sorted(c.name for c in self.pm.get_hookcallers(plugin) or ()))
        record = PluginRecord(
            name=name,
            dist=dist,
            version=version,
            kind=_kind_of(plugin, hooks),
            status="loaded",
            hooks=hooks,
            builtin=builtin,
        )
        self.records[name] = record
        return record

    def _fail(self, name: str, dist: str | None, version: str | None, error: str,
              builtin: bool, *, replace: bool = True) -> PluginRecord:
        log.error("plugin %s (%s %s) failed to load: %s", name, dist or "?", version or "?", error)
        record = PluginRecord(name=name, dist=dist, version=version, kind="?", status="failed",
                              error=error, builtin=builtin)
        key = name if replace else f"{name} ({dist or 'duplicate'})"
        self.records[key] = record
        return record

    # -- calling hooks with provenance ---------------------------------------------------------

    def first_answer(self, hook_name: str, **kwargs: Any) -> tuple[str | None, Any]:
        """Call a ``firstresult`` hook and say which plugin answered.

        Walks the implementations in pluggy's call order and returns ``(plugin_name, value)``
        for the first non-``None`` answer, ``(None, None)`` when none answered. An exception is
        re-raised as :class:`PluginError` naming the plugin.
        """
        for plugin, value in self._answers(hook_name, kwargs):
            if value is not None:
                return plugin, value
        return None, None

    def collect(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call a collection hook; return ``(plugin_name, item)`` for every contributed item.

        A list (or tuple) answer contributes its items; a mapping or other object contributes
        itself. ``None`` contributes nothing.
        """
        out: list[tuple[str, Any]] = []
        for plugin, value in self._answers(hook_name, kwargs):
            if isinstance(value, (list, tuple)):
                out.extend((plugin, item) for item in value)
            elif value is not None:
                out.append((plugin, value))
        return out

    def notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call an observer hook: every implementation runs, whatever the others do.

        An observer's exception (typed or not) is logged as a :class:`PluginError` naming it
        and skipped: observers watch work that is already done, so their faults never reach
        the client nor silence the other observers.
        """
        caller = getattr(self.pm.hook, hook_name)
        for impl in reversed(caller.get_hookimpls()):
            try:
                impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
            except Exception as exc:  # plugin boundary
                log.warning("%s", PluginError(impl.plugin_name, hook_name, exc).message)

    def collect_at_start(self, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """:meth:`collect` for the hooks called while the server starts (routes, start-up,
        serve options, commands): a plugin whose implementation raises is marked failed
        (:meth:`fail_at_start`) and left out, so the server starts without it."""
        out: list[tuple[str, Any]] = []
        for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):
            try:
                value = _call(impl, hook_name, kwargs)
            except MlxrtError as exc:
                self.fail_at_start(impl.plugin_name, hook_name, exc)
                continue
            if isinstance(value, (list, tuple)):
                out.extend((impl.plugin_name, item) for item in value)
            elif value is not None:
                out.append((impl.plugin_name, value))
        return out

    def fail_at_start(self, name: str, hook_name: str, exc: BaseException) -> None:
        """Plugin ``name`` raised in a start-time hook: record it failed (``mlxrt plugins``,
        ``/stats``) and unregister it, so none of its hooks runs again. Under
        ``MLXRT_STRICT_PLUGINS=1`` the failure is raised as a :class:`PluginError` instead."""
        error = exc if isinstance(exc, PluginError) else PluginError(name, hook_name, exc)
        if self.strict:
            raise error
        log.error("plugin %s failed at start and is skipped: %s", name, error.message)
        record = self.records.get(name)
        if record is not None:
            self.records[name] = attrs.evolve(record, status="failed", error=error.message)
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)

    def _answers(self, hook_name: str, kwargs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        """Each implementation's answer, lazily, in pluggy's call order (last registered first).

        Implementations get only the arguments they name. A typed :class:`MlxrtError` (an
        ``InvalidRequest`` about a claimed field, say) is the client's and passes through; any
        other exception is the plugin's fault and becomes a :class:`PluginError` naming it.
        """
        caller = getattr(self.pm.hook, hook_name)
        for impl in reversed(caller.get_hookimpls()):
            yield impl.plugin_name, _call(impl, hook_name, kwargs)


def _call(impl: Any, hook_name: str, kwargs: dict[str, Any]) -> Any:
    """One implementation of ``hook_name`` with the arguments it names; see ``_answers``."""
    try:
        return impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
    except MlxrtError:
        raise
    except Exception as exc:  # plugin boundary
        raise PluginError(impl.plugin_name, hook_name, exc) from exc


def _kind_of(plugin: object, hooks: Iterable[str]) -> str:
    declared = getattr(plugin, "MLXRT_PLUGIN_KIND", None)
    if isinstance(declared, str):
        return declared
    names = set(hooks)
    if names & FAMILY_HOOKS:
        return "family"
    if "mlxrt_routes" in names:
        return "endpoint"
    if names & _SAMPLER_HOOKS:
        return "sampler"
    return "other"
