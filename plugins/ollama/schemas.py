"""The OpenAPI description of the Ollama routes' bodies (``opt["body_schema"]``) and of their
errors (``opt["error_schema"]``: ``{"error": "..."}``), so schema-driven clients and fuzzers
reach them (:mod:`mlxrt.api.openapi`). They say what a well-formed body looks like; the
decoders still decide."""

from __future__ import annotations

from typing import Any

from mlxrt.plugins.ollama.wire import ROUTE_OPT

__all__ = ["opt"]

ERROR: dict[str, Any] = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_OPTIONS = {"type": "object", "properties": {
    "num_predict": {"type": "integer"}, "num_ctx": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0}, "top_k": {"type": "integer", "minimum": 0},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1}, "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "repeat_penalty": {"type": "number", "minimum": 0}, "repeat_last_n": {"type": "integer", "minimum": -1},
    "seed": {"type": "integer"}, "stop": {"type": "array", "items": {"type": "string"}}}}
_COMMON = {"model": {"type": "string"}, "stream": {"type": "boolean"}, "options": _OPTIONS,
           "format": {"anyOf": [{"type": "string", "enum": ["", "json"]}, {"type": "object"}]},
           "keep_alive": {"anyOf": [{"type": "number"}, {"type": "string", "pattern": "^-?[0-9]+(ms|s|m|h)?$"}]},
           "think": {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["low", "medium", "high"]}]}}
_IMAGES = {"type": "array", "items": {"type": "string"}}
CHAT = {"type": "object", "required": ["model", "messages"], "properties": {
    **_COMMON,
    "messages": {"type": "array", "items": {"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]}, "content": {"type": "string"},
        "thinking": {"type": "string"}, "images": _IMAGES, "tool_name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object", "required": ["function"], "properties": {
            "function": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "arguments": {"type": "object"}}}}}}}}},
    "tools": {"type": "array", "items": {"type": "object", "required": ["function"], "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "description": {"type": "string"}, "parameters": {"type": "object"}}}}}}}}
GENERATE = {"type": "object", "required": ["model"], "properties": {
    **_COMMON, "prompt": {"type": "string"}, "system": {"type": "string"}, "raw": {"type": "boolean"},
    "images": _IMAGES, "suffix": {"type": "string"}, "template": {"type": "string"},
    "context": {"type": "array", "items": {"type": "integer"}}}}
EMBED = {"type": "object", "required": ["model", "input"], "properties": {
    "model": {"type": "string"}, "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "truncate": {"type": "boolean"}, "dimensions": {"type": "integer", "minimum": 1}, "options": _OPTIONS,
    "keep_alive": _COMMON["keep_alive"]}}
EMBEDDINGS = {"type": "object", "required": ["model", "prompt"], "properties": {
    "model": {"type": "string"}, "prompt": {"type": "string"}, "options": _OPTIONS, "keep_alive": _COMMON["keep_alive"]}}
NAMED = {"type": "object", "required": ["model"], "properties": {"model": {"type": "string"}}}
PULL = {"type": "object", "required": ["model"], "properties": {
    "model": {"type": "string"}, "stream": {"type": "boolean"}, "insecure": {"type": "boolean"}}}


def opt(body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A route's ``opt``: errors in Ollama's shape, documented with ``body`` as its request body."""
    return {**ROUTE_OPT, "error_schema": ERROR, **({"body_schema": body} if body is not None else {})}
