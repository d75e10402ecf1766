"""Request fields llama-server added to OpenAI's chat and text completions, read by mlxrt too
(docs/dialects.md, "llama.cpp and vLLM fields"):

- ``grammar``: a GBNF grammar the answer follows (llama.cpp's grammar format);
- ``json_schema``: a JSON schema the answer follows (llama.cpp's shorthand for
  ``response_format: {"type": "json_schema", ...}``), and ``response_format: {"type":
  "json_object", "schema": {...}}``, a ``json_object`` held to a schema;
- ``continue_final_message`` / ``add_generation_prompt`` (vLLM's and transformers' names): the
  answer continues the last message (an assistant prefill) rather than opening a new turn;
- ``verbose``: the answer carries ``__verbose.prompt``, the prompt as the chat template
  rendered it.

At most one output constraint per request: ``response_format``, ``json_schema`` and ``grammar``
together are a 400 naming the fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt.api.output_format import json_schema_output, structured_output
from mlxrt.errors import InvalidRequest
from mlxrt.records import StructuredOutput

__all__ = ["STRUCTURED_FIELDS", "request_structured", "template_ending"]

#: The raw body fields that carry an output constraint (decoded by :func:`request_structured`).
STRUCTURED_FIELDS = ("response_format", "json_schema", "grammar")


def request_structured(body: Mapping[str, Any]) -> StructuredOutput | None:
    """The body's one output constraint: ``response_format`` (OpenAI's kinds, plus a
    ``json_object`` with a ``schema``), ``json_schema`` or ``grammar``; ``None``: free text."""
    given = [name for name in STRUCTURED_FIELDS if body.get(name) is not None
             and not (name == "response_format" and isinstance(body[name], dict) and body[name].get("type") == "text")]
    if len(given) > 1:
        raise InvalidRequest(f"{' and '.join(given)} cannot be combined: give one output constraint", param=given[1])
    if "grammar" in given:
        grammar = body["grammar"]
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidRequest("grammar must be a non-empty string (a GBNF grammar)", param="grammar")
        return StructuredOutput(kind="gbnf", spec=grammar, param="grammar")
    if "json_schema" in given:
        return json_schema_output(body["json_schema"], param="json_schema")
    value = body.get("response_format")
    if isinstance(value, dict) and value.get("type") == "json_object" and "schema" in value:
        return json_schema_output(value["schema"], param="response_format.schema")
    return structured_output(value)


def template_ending(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool | None,
                    continue_final_message: bool | None) -> tuple[bool, bool]:
    """``(add_generation_prompt, continue_final_message)`` for the chat template.

    ``continue_final_message`` needs a last message with text to continue (usually the
    assistant's: a prefill) and leaves the
    generation prompt out (``add_generation_prompt: true`` beside it is a 400, as in vLLM).
    A last assistant message without it is closed, and the answer is a new turn (OpenAI's and
    mlx_lm.server's reading; llama-server continues it).
    """
    if not continue_final_message:
        return (True if add_generation_prompt is None else add_generation_prompt), False
    if add_generation_prompt:
        raise InvalidRequest("continue_final_message and add_generation_prompt cannot both be true: the answer either "
                             "continues the last message or opens a new one", param="continue_final_message")
    if not messages[-1].get("content"):
        raise InvalidRequest("continue_final_message needs a last message with text to continue",
                             param="continue_final_message")
    return False, True
