"""Output formats: a dialect's ``response_format`` (or ``text.format``) decoded into the
engine's :class:`~mlxrt.records.StructuredOutput` constraint."""

from __future__ import annotations

from typing import Any

from mlxrt.errors import InvalidRequest
from mlxrt.records import StructuredOutput

__all__ = ["json_schema_output", "structured_output"]

def json_schema_output(schema: Any, *, param: str) -> StructuredOutput:
    """A JSON-schema constraint; the schema's compact JSON keys the grammar cache.

    Keys keep the client's order: property order is the order of the generated object."""
    import json

    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}: the schema must be a JSON object", param=param)
    return StructuredOutput(kind="json_schema", spec=json.dumps(schema, separators=(",", ":")),
                            param=param)


def structured_output(value: Any, *, param: str = "response_format",
                      flat: bool = False) -> StructuredOutput | None:
    """An OpenAI-shaped output format → the engine's constraint (``None``: free text).

    ``{"type": "json_object"}``; ``{"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}`` (``flat``: the Responses shape, ``name``/``schema`` beside ``type``); and the
    mlxrt extensions ``{"type": "regex", "regex": "..."}`` and ``{"type": "choice",
    "choices": ["a", "b"]}``. Whether the schema compiles is checked later, off the event loop
    (:func:`mlxrt.api.pipeline.planned_chat`).
    """
    import json

    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(kind="json_object", param=param)
    if kind == "json_schema":
        body = value if flat else value.get("json_schema")
        where = param if flat else f"{param}.json_schema"
        if not isinstance(body, dict):
            raise InvalidRequest(f"{where} must be an object with a schema", param=param)
        if body.get("name") is not None and not isinstance(body["name"], str):
            raise InvalidRequest(f"{where}.name must be a string", param=param)
        if body.get("strict") is not None and not isinstance(body["strict"], bool):
            raise InvalidRequest(f"{where}.strict must be a boolean", param=param)
        # No schema is any JSON value's schema; OpenAI requires one, we accept the default.
        return json_schema_output(body.get("schema", {}), param=f"{where}.schema")
    if kind == "regex":
        if not isinstance(value.get("regex"), str) or not value["regex"]:
            raise InvalidRequest(f"{param}.regex must be a non-empty string", param=param)
        return StructuredOutput(kind="regex", spec=value["regex"], param=f"{param}.regex")
    if kind == "choice":
        choices = value.get("choices")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise InvalidRequest(f"{param}.choices must be a non-empty list of non-empty strings", param=param)
        return StructuredOutput(kind="choice", spec=json.dumps(choices), param=f"{param}.choices")
    raise InvalidRequest(f"{param}.type must be one of text, json_object, json_schema, regex, choice",
                         param=param)
