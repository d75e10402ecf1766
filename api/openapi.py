"""What the OpenAPI schema (``/schema/openapi.json``) says about request and error bodies.

mlxrt's handlers read their bodies themselves (a strict decode at the edge, each dialect's
own 400s), so Litestar sees no ``data`` parameter and would declare no ``requestBody``, and its
error responses would describe Litestar's ``{"status_code", "detail"}`` bodies, which mlxrt
never sends. Schema-driven clients and fuzzers then never reach the bodies. :func:`document`
gives every route handler an ``operation_class`` that adds:

* a ``requestBody`` on every POST/PUT/PATCH: the route's ``opt["body_schema"]`` (a JSON
  schema; plugins may set it), else the built-in routes' schema from :data:`BODIES`, else
  any JSON object;
* ``4XX`` and ``5XX`` responses whose body is the route's ``opt["error_schema"]``, else
  :data:`ERROR_BODY`, the shape every error takes but Ollama's (``{"error": {"message",
  "type", "param", "code"}}``; Anthropic routes add ``"type": "error"`` beside it), in place
  of Litestar's own error responses.

The schemas say what a well-formed body looks like, not every rule: the decoders still decide
(a body the schema accepts may still get a 400 naming the field). The bounds and types of the
top-level fields are the decoders' own: each built-in body is overlaid with its dialect's
field rules (:class:`mlxrt.api.wire.FieldRule`: type, ``minimum``/``maximum``, ``null`` where
the field may be null; the route's ``opt["field_rules"]``, set by the dialect beside its handler), so the schema and the checks cannot drift apart (schemathesis found
``top_logprobs`` documented up to 20 and refused past 11, ``model: null`` accepted and not
documented).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from litestar.handlers import HTTPRouteHandler
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation, RequestBody
from litestar.router import Router

__all__ = ["BODIES", "ERROR_BODY", "document", "rule_schema", "with_rules"]

#: Every error body, whatever the route's dialect.
ERROR_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        },
        "type": {"type": "string", "enum": ["error"], "description": "Anthropic routes only"},
    },
}

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_STRINGS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object", "required": ["type"]}}]}
_ANTHROPIC_TOOL_CHOICE = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}}}
_THINKING = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive"]}}}
_SAMPLING = {
    "model": {"type": "string"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "seed": {"type": "integer"},
    "stream": {"type": "boolean"},
}
#: llama.cpp's constraint fields: one at most (mlxrt.plugins.openai.llama_fields).
_ONE_CONSTRAINT = {"not": {"anyOf": [{"required": ["json_schema", "grammar"]}]}}
_TOOLS = {"type": "array", "items": {
    "type": "object", "required": ["type", "function"],
    "properties": {"type": {"type": "string", "enum": ["function"]},
                   "function": {"type": "object", "required": ["name"],
                                "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                                               "description": {"type": "string"},
                                               "parameters": {"type": "object"}}}}}}
_CHAT = {
    "type": "object",
    "required": ["messages"],
    **_ONE_CONSTRAINT,
    "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role"],
            "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                           "content": {"anyOf": [*_CONTENT["anyOf"], {"type": "null"}]},
                           "name": {"type": "string"}, "tool_calls": {"type": "array", "items": _ANY_OBJECT},
                           "tool_call_id": {"type": "string"}}}},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "stop": _STRINGS,
        "n": {"type": "integer", "minimum": 1, "maximum": 128},  # mlxrt.engine.admission.MAX_CHOICES
        "tools": _TOOLS,
        "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {
            "type": "object", "required": ["type", "function"],
            "properties": {"type": {"type": "string", "enum": ["function"]},
                           "function": {"type": "object", "required": ["name"],
                                        "properties": {"name": {"type": "string"}}}}}]},
        "response_format": {"type": "object", "required": ["type"],
                            "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}}},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    },
}
_COMPLETIONS = {
    "type": "object",
    "required": ["prompt"],
    **_ONE_CONSTRAINT,
    # one non-empty string (token-array prompts are refused, as mlx_lm.server refuses them)
    "properties": {**_SAMPLING, "prompt": {"type": "string", "minLength": 1}, "max_tokens": {"type": "integer", "minimum": 1},
                   "stop": _STRINGS, "echo": {"enum": [False, None]}, "logprobs": {"type": "integer", "minimum": 0}},
}
_EMBEDDINGS = {
    "type": "object",
    "required": ["input"],
    "properties": {"model": {"type": "string"}, "input": _STRINGS,
                   "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                   "dimensions": {"type": "integer", "minimum": 1}, "user": {"type": "string"}},
}
_ANTHROPIC_MESSAGES = {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"type": "string", "enum": ["user", "assistant"]}, "content": _CONTENT}}}
_MESSAGES = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": {**_SAMPLING, "max_tokens": {"type": "integer", "minimum": 1}, "messages": _ANTHROPIC_MESSAGES,
                   "system": _CONTENT, "stop_sequences": {"type": "array", "items": {"type": "string"}},
                   "tools": {"type": "array", "items": {"type": "object", "required": ["name"]}},
                   "tool_choice": _ANTHROPIC_TOOL_CHOICE, "thinking": _THINKING, "metadata": _ANY_OBJECT},
}
_COUNT_TOKENS = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {"model": {"type": "string"}, "messages": _ANTHROPIC_MESSAGES, "system": _CONTENT,
                   "tools": {"type": "array", "items": {"type": "object", "required": ["name"]}},
                   "tool_choice": _ANTHROPIC_TOOL_CHOICE, "thinking": _THINKING},
}
_RESPONSES = {
    "type": "object",
    "required": ["input"],
    # input items: a typed item, or a message ({"role", "content"})
    "properties": {**_SAMPLING, "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
        "type": "object", "anyOf": [{"required": ["type"]}, {"required": ["role", "content"]}]}}]},
                   "instructions": {"type": "string"}, "max_output_tokens": {"type": "integer", "minimum": 1},
                   "previous_response_id": {"type": "string"}, "store": {"type": "boolean"},
                   "tools": {"type": "array", "items": _ANY_OBJECT}, "text": _ANY_OBJECT,
                   "reasoning": _ANY_OBJECT,
                   "tool_choice": {"anyOf": [{"type": "string", "enum": ["auto", "none", "required"]}, {
                       "type": "object", "required": ["type", "name"],
                       "properties": {"type": {"type": "string", "enum": ["function"]}, "name": {"type": "string"}}}]}},
}
_ADAPTERS = {
    "type": "object",
    "required": ["path"],
    "properties": {"id": {"type": "string"}, "path": {"type": "string", "minLength": 1}},
}

#: The built-in routes' request bodies, by path.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": _CHAT, "/chat/completions": _CHAT,
    "/v1/completions": _COMPLETIONS, "/completions": _COMPLETIONS,
    "/v1/embeddings": _EMBEDDINGS, "/embeddings": _EMBEDDINGS,
    "/v1/messages": _MESSAGES, "/v1/messages/count_tokens": _COUNT_TOKENS,
    "/v1/responses": _RESPONSES, "/responses": _RESPONSES,
    "/v1/adapters": _ADAPTERS,
}

_WITH_BODY = {"POST", "PUT", "PATCH"}


def _json(schema: dict[str, Any]) -> dict[str, OpenAPIMediaType]:
    return {"application/json": OpenAPIMediaType(schema=schema)}  # type: ignore[arg-type]  # a plain JSON schema


#: Bounds a field has beyond its rule, enforced by another check (named beside each).
_ENFORCED_ELSEWHERE: dict[str, dict[str, Any]] = {
    "n": {"maximum": 128},  # mlxrt.engine.admission.check_choices
}


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array"}
_PLAIN = {"type", "minimum", "maximum"}


def rule_schema(rule: Any, *, nullable: bool | None = None) -> dict[str, Any]:
    """The JSON schema of a field checked by ``rule`` (a :class:`mlxrt.api.wire.FieldRule`)."""
    kinds: list[str] = []
    for t in rule.types:
        kind = "number" if t in (int, float) and float in rule.types else _JSON_TYPES[t]
        if kind not in kinds:
            kinds.append(kind)
    if rule.nullable if nullable is None else nullable:
        kinds.append("null")
    schema: dict[str, Any] = {"type": kinds[0] if len(kinds) == 1 else kinds}
    if rule.min is not None:
        schema["minimum"] = rule.min
    if rule.max is not None:
        schema["maximum"] = rule.max
    schema.update(_ENFORCED_ELSEWHERE.get(rule.name, {}))
    if rule.allowed:
        return {"anyOf": [schema, {"enum": list(rule.allowed)}]}
    return schema


def with_rules(body: dict[str, Any], rules: Iterable[Any]) -> dict[str, Any]:
    """``body`` (an object schema) with each field checked by ``rules`` typed and bounded as the
    rule checks it: a plain field (type and bounds only) is replaced, a structured one keeps its
    structure and gains ``null`` where the rule lets it be null; a field the schema lacks is added."""
    properties = dict(body.get("properties") or {})
    required = set(body.get("required") or ())
    for rule in rules:
        nullable = rule.nullable and rule.name not in required
        current = properties.get(rule.name)
        if current is None or set(current) <= _PLAIN:
            properties[rule.name] = rule_schema(rule, nullable=nullable)
        elif nullable:
            properties[rule.name] = {"anyOf": [current, {"type": "null"}]}
    return {**body, "properties": properties}


def _operation_class(handler: HTTPRouteHandler) -> type[Operation]:
    body = handler.opt.get("body_schema") or next((BODIES[p] for p in handler.paths if p in BODIES), _ANY_OBJECT)
    error = handler.opt.get("error_schema") or ERROR_BODY  # a dialect whose errors have another shape (Ollama's)
    if rules := handler.opt.get("field_rules", ()):  # the checks a dialect's route runs on its body
        body = with_rules(body, rules)
    wants_body = bool(_WITH_BODY & set(handler.http_methods))

    def __init__(self: Operation, *args: Any, **kwargs: Any) -> None:
        Operation.__init__(self, *args, **kwargs)
        if wants_body and self.request_body is None:
            self.request_body = RequestBody(content=_json(body), required=True)
        responses = {code: r for code, r in (self.responses or {}).items() if code[:1] not in "45"}
        for code, what in (("4XX", "The request was refused (the message says why)"),
                           ("5XX", "The server could not answer (the message says why)")):
            responses[code] = OpenAPIResponse(description=what, content=_json(error))
        self.responses = responses

    # A plain subclass (Operation's dataclass fields are inherited), built at every server's
    # start for each route: @dataclass would generate and compile its methods each time
    # (~1 ms a route, ~30 ms of the start).
    return type("Documented", (Operation,), {"__init__": __init__, "__module__": __name__})


def _handlers(routes: Iterable[Any]) -> Iterable[HTTPRouteHandler]:
    for item in routes:
        if isinstance(item, HTTPRouteHandler):
            yield item
        elif isinstance(item, Router):
            for route in item.routes:
                yield from (h for h in getattr(route, "route_handlers", ()) if isinstance(h, HTTPRouteHandler))
        elif inspect.isclass(item):  # a controller
            yield from (v for v in vars(item).values() if isinstance(v, HTTPRouteHandler))


def document(routes: Iterable[Any]) -> None:
    """Give each route handler of ``routes`` (handlers, routers, controllers) the
    ``operation_class`` described above; the schema itself is built on its first request."""
    for handler in _handlers(routes):
        handler.operation_class = _operation_class(handler)
