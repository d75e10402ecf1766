"""Numbers a grammar lets a model write in JSON: a bounded number of digits.

A JSON-schema ``number`` or ``integer`` compiled as it is lets a model write digits forever
(SmolLM2 under ``client.chat.completions.parse`` with a float field wrote
``12112222222…`` until ``max_tokens``). Before a schema is compiled, every node typed
``number`` or ``integer`` that sets no bound of its own gets one, as llama.cpp's JSON-schema
grammar bounds its integral part to 16 digits:

- the integral part has at most :data:`INTEGRAL_DIGITS` (16) digits: ``|x| < 10**16``
  (``minimum``/``maximum`` for integers, the exclusive ones for numbers; llguidance then allows
  no exponent either);
- a ``number``'s fraction has at most :data:`FRACTION_DIGITS` (10) digits (``multipleOf``
  ``1e-10``, the finest step llguidance represents exactly).

A bound the schema sets itself is kept (``minimum: 0`` still gets the upper bound);
``json_object`` is compiled as :data:`JSON_OBJECT`, so its numbers are bounded too. The
structured-output plugin and the forced tool-call grammars (:mod:`mlxrt.text.tool_grammar`)
both compile schemas through :func:`bounded_numbers`; XML-style tool markups use
:func:`number_regex`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["INTEGRAL_DIGITS", "FRACTION_DIGITS", "JSON_OBJECT", "bounded_numbers", "number_regex"]

INTEGRAL_DIGITS = 16
FRACTION_DIGITS = 10

_LIMIT = 10**INTEGRAL_DIGITS
#: Keys whose value is one subschema / a list of them / a map of name → subschema.
_ONE = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
        "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


#: ``response_format: {"type": "json_object"}``: any JSON object, spelled out (values nest
#: through ``$defs``) so that its numbers can be bounded like a schema's.
JSON_OBJECT: Mapping[str, Any] = {
    "type": "object", "additionalProperties": {"$ref": "#/$defs/value"},
    "$defs": {"value": {"anyOf": [
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}},
        {"type": "array", "items": {"$ref": "#/$defs/value"}},
        {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]}},
}


def bounded_numbers(schema: Any) -> Any:
    """A copy of ``schema`` whose ``number``/``integer`` nodes without bounds have them."""
    if not isinstance(schema, Mapping):
        return schema
    node = dict(schema)
    for key in _ONE:
        if isinstance(node.get(key), Mapping):
            node[key] = bounded_numbers(node[key])
        elif key == "items" and isinstance(node.get(key), list):
            node[key] = [bounded_numbers(s) for s in node[key]]
    for key in _LIST:
        if isinstance(node.get(key), list):
            node[key] = [bounded_numbers(s) for s in node[key]]
    for key in _MAP:
        if isinstance(node.get(key), Mapping):
            node[key] = {k: bounded_numbers(s) for k, s in node[key].items()}
    kind = node.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if "integer" in kinds and "number" not in kinds:
        if "minimum" not in node and "exclusiveMinimum" not in node:
            node["minimum"] = -(_LIMIT - 1)
        if "maximum" not in node and "exclusiveMaximum" not in node:
            node["maximum"] = _LIMIT - 1
    elif "number" in kinds:
        if "minimum" not in node and "exclusiveMinimum" not in node:
            node["exclusiveMinimum"] = -_LIMIT
        if "maximum" not in node and "exclusiveMaximum" not in node:
            node["exclusiveMaximum"] = _LIMIT
        node.setdefault("multipleOf", 10.0 ** -FRACTION_DIGITS)
    return node


def number_regex(integer: bool) -> str:
    """A number written as plain text (XML-style tool markups), with the same bounds."""
    whole = f"-?[0-9]{{1,{INTEGRAL_DIGITS}}}"
    return whole if integer else f"{whole}(?:\\.[0-9]{{1,{FRACTION_DIGITS}}})?"
