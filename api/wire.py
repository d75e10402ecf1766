"""Wire-type conversion at the HTTP edge: raw bodies → validated values, with exact error texts.

Two steps, both strict:

1. :func:`check_fields` validates the raw JSON against a table of rules and raises the texts
   mlx_lm.server uses (``max_tokens must be of type int``, ``top_p must be at most 1``…).
   Unlike mlx_lm.server, a JSON ``true`` is not accepted where a number is expected.
2. :func:`strict_converter` builds a cattrs converter that never coerces (cattrs' default
   turns ``"false"`` into ``True``, ``"END"`` into ``['E','N','D']`` and ``3.7`` into ``3``),
   for structuring into a dialect's attrs wire types.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.strategies import configure_union_passthrough

from mlxrt.errors import InvalidRequest
from mlxrt.records import ToolCall

__all__ = ["tool_input", "FieldRule", "check_fields", "parse_json_object", "strict_converter", "structure",
           "declared_fields", "claimed_values", "ignored_fields", "ignored_headers", "IGNORED_HEADER", "HINT_FIELDS",
           "SATISFIED_INCLUDES"]

T = TypeVar("T")


def _no_constants(name: str) -> Any:
    # NaN and Infinity are not JSON; Python's parser accepts them and they slip past range checks.
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object (no NaN, no lone surrogates)."""
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        # Python's parser recurses per nesting level; ~1,000 levels exhaust the stack.
        raise InvalidRequest("invalid JSON body: nested too deeply") from None
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("invalid JSON body") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Request should be a JSON dictionary")
    # A "\ud800" escape decodes to a lone surrogate no tokenizer or encoder accepts; only a
    # body that holds a \uD8xx-\uDFxx escape can carry one, so the walk is rarely needed.
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _refuse_lone_surrogates(body)
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(value: Any) -> None:
    stack = [value]
    while stack:  # iterative: the body may be nested as deep as the parser allowed
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                bad = item[exc.start]
                raise InvalidRequest(f"invalid JSON body: lone surrogate \\u{ord(bad):04x} in a string "
                                     "(not valid Unicode)") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


@attrs.frozen
class FieldRule:
    """How one top-level field is validated (mirrors mlx_lm.server's ``_validate``)."""

    name: str
    types: tuple[type, ...]
    min: float | None = None
    max: float | None = None
    nullable: bool = True
    allowed: tuple[Any, ...] = ()


def _type_text(types: tuple[type, ...]) -> str:
    # mlx_lm.server prints a tuple of type names for multi-type fields.
    if len(types) == 1:
        return types[0].__name__
    return str(tuple(t.__name__ for t in types))


def _is_instance(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def check_fields(body: Mapping[str, Any], rules: Sequence[FieldRule]) -> None:
    """Raise :class:`InvalidRequest` for the first field that breaks its rule."""
    for rule in rules:
        if rule.name not in body:
            continue
        value = body[rule.name]
        if value is None and rule.nullable:
            continue
        if not _is_instance(value, rule.types):
            raise InvalidRequest(f"{rule.name} must be of type {_type_text(rule.types)}", param=rule.name)
        if value in rule.allowed:
            continue
        if rule.min is not None and value < rule.min:
            raise InvalidRequest(f"{rule.name} must be at least {_num(rule.min)}", param=rule.name)
        if rule.max is not None and value > rule.max:
            raise InvalidRequest(f"{rule.name} must be at most {_num(rule.max)}", param=rule.name)


def check_object(value: Any, name: str, fields: Sequence[str], rules: Sequence[FieldRule]) -> Mapping[str, Any]:
    """A nested request object (``hlg``, the designer's ``recipe``): a dict of known ``fields``,
    each following its rule (rules named ``"<name>.<field>"``); the first problem is a 400."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{name} must be of type dict", param=name)
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise InvalidRequest(f"{name} has unknown field {unknown[0]!r}; allowed: {', '.join(fields)}",
                             param=name)
    check_fields({f"{name}.{k}": v for k, v in value.items()}, rules)
    return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def strict_converter() -> cattrs.Converter:
    """A cattrs converter that rejects instead of coercing."""
    conv = cattrs.Converter(forbid_extra_keys=False)

    def exact(kind: type, name: str) -> Callable[[Any, Any], Any]:
        def hook(value: Any, _type: Any) -> Any:
            if isinstance(value, bool) and kind is not bool:
                raise TypeError(f"expected {name}")
            if kind is float and isinstance(value, int):
                return float(value)
            if not isinstance(value, kind):
                raise TypeError(f"expected {name}")
            return value

        return hook

    for kind in (int, float, bool, str):
        conv.register_structure_hook(kind, exact(kind, kind.__name__))

    def no_str_list(value: Any, type_: Any) -> Any:
        """``list[X]`` or ``tuple[X, ...]`` from a JSON array only (never a string's characters)."""
        if not isinstance(value, list):
            raise TypeError("expected list")
        items = [conv.structure(v, type_.__args__[0]) for v in value]
        return items if type_.__origin__ is list else tuple(items)

    conv.register_structure_hook_func(
        lambda t: getattr(t, "__origin__", None) in (list, tuple) and len(getattr(t, "__args__", ())) <= 2
        and (getattr(t, "__origin__", None) is list or getattr(t, "__args__", (None, None))[-1] is Ellipsis),
        no_str_list,
    )
    configure_union_passthrough(int | float | str | bool | None, conv)
    return conv


def declared_fields(body: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """The body's fields the attrs class ``cls`` declares, those sent as ``null`` left out: a
    null is "not given" (the OpenAI spec's nullable fields, such as ``stream``, mean their
    default), and a rule with ``nullable=False`` has refused it already where it is not."""
    fields = {f.name for f in attrs.fields(cls)}
    return {k: v for k, v in body.items() if k in fields and v is not None}


def structure(conv: cattrs.Converter, value: Any, cls: type[T], *, where: str = "") -> T:
    """Structure ``value`` into ``cls``; a failure becomes a 400 naming the path."""
    try:
        return conv.structure(value, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            detail = "; ".join(cattrs.transform_error(exc, path=where or "$"))
        else:
            detail = f"{where or 'body'}: {exc}"
        raise InvalidRequest(f"invalid request: {detail}") from None


def claimed_values(body: Mapping[str, Any], claimed: Mapping[str, type]) -> dict[str, Any]:
    """The plugin-claimed fields (``mlxrt_request_fields``) present in ``body``, type-checked."""
    extra = {}
    for name, kind in claimed.items():
        if name not in body or body[name] is None:
            continue
        value = body[name]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise InvalidRequest(f"{name} must be of type {kind.__name__}", param=name)
        extra[name] = value
    return extra


def adapter_field(body: Mapping[str, Any]) -> str | None:
    """The ``adapter`` field every dialect accepts (``"id"``, ``"a+b"``, ``"none"``); ``None``
    runs the server's default adapter set."""
    adapter = body.get("adapter")
    if adapter is not None and not isinstance(adapter, str):
        raise InvalidRequest("adapter must be of type str (\"id\", \"a+b\" or \"none\")", param="adapter")
    return adapter


#: ``include`` entries (Responses) mlxrt's answer already satisfies: reasoning comes back in the
#: clear, in the reasoning item's ``content``, and reasoning items sent back are dropped (the
#: template re-derives them), so nothing needs the encrypted copy a stateless client asks for.
SATISFIED_INCLUDES = frozenset({"reasoning.encrypted_content"})


def _always(_value: Any) -> bool:
    return True


def _satisfied_include(value: Any) -> bool:
    return isinstance(value, list) and all(entry in SATISFIED_INCLUDES for entry in value)


def _keeps_everything(value: Any) -> bool:
    # Claude Code's ``{"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}`` clears
    # nothing; an edit that clears thinking or tool results would change the prompt.
    edits = value.get("edits") if isinstance(value, dict) else None
    return isinstance(edits, list) and all(
        isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking") and e.get("keep") == "all"
        for e in edits)


#: Fields that never change the answer, by name, with the test a value must pass to be one:
#: hints to a provider's infrastructure (prompt caching, routing, service tiers, abuse
#: tracking) and the client's bookkeeping. ``--strict`` accepts them (``x-mlxrt-ignored``
#: still names those nobody reads): it refuses only fields that would change the answer and
#: that mlxrt cannot honour (docs/usage.md, "Fields nobody reads").
HINT_FIELDS: Mapping[str, Callable[[Any], bool]] = {
    "prompt_cache_key": _always,          # OpenAI: which cache shard; mlxrt's cache keys on the prompt
    "prompt_cache_retention": _always,    # OpenAI: how long to keep it; mlxrt's cache has its own bounds
    "safety_identifier": _always,         # OpenAI: abuse tracking per end user
    "user": _always,                      # OpenAI's older name for it
    "metadata": _always,                  # stored with the response by OpenAI, returned as sent
    "client_metadata": _always,           # Codex: its own bookkeeping (ids of the session and turn)
    "service_tier": _always,              # OpenAI: which capacity pool
    "store": _always,                     # whether OpenAI keeps the response
    "include": _satisfied_include,        # empty (the Agents SDK) or entries the answer satisfies
    "context_management": _keeps_everything,  # Anthropic: edits that clear nothing (Claude Code's)
}


def ignored_fields(body: Mapping[str, Any], known: set[str] | frozenset[str], strict: bool) -> tuple[str, ...]:
    """Body fields nobody reads (for ``x-mlxrt-ignored``). Under ``--strict`` those that could
    change the answer are a 400 instead; hints and bookkeeping (:data:`HINT_FIELDS`) are not."""
    ignored = tuple(sorted(k for k in body if k not in known))
    refused = [k for k in ignored if not (k in HINT_FIELDS and HINT_FIELDS[k](body[k]))]
    if refused and strict:
        raise InvalidRequest(f"unknown field{'s' if len(refused) > 1 else ''}: {', '.join(refused)} "
                             "(the server runs with --strict)", param=refused[0], code="unknown_parameter")
    return ignored


#: Names the body fields the server did not act on (unknown ones; ``tools`` on a model that
#: cannot parse tool calls).
IGNORED_HEADER = "x-mlxrt-ignored"
#: Ignored fields ``x-mlxrt-ignored`` names at most (a body may hold thousands).
MAX_IGNORED_NAMED = 32


def ignored_headers(ignored: Sequence[str]) -> dict[str, str]:
    """``x-mlxrt-ignored``, naming the body fields nobody read (none: no header). A header
    value is Latin-1 without control characters, so each name is written with Python's
    escapes (``\\n``, ``\\u00e9``) past printable ASCII; a non-ASCII field name was a 500."""
    if not ignored:
        return {}
    named = [name if name.isascii() and name.isprintable() else name.encode("unicode_escape").decode("ascii")
             for name in ignored[:MAX_IGNORED_NAMED]]
    more = len(ignored) - len(named)
    return {IGNORED_HEADER: ", ".join(named) + (f" (and {more} more)" if more else "")}


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A parsed call's arguments as an object (``{"_raw": text}`` when they are not one)."""
    try:
        value = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        return {"_raw": call.arguments}
    return value if isinstance(value, dict) else {"_raw": call.arguments}
