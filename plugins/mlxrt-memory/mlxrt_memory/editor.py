"""The editor: the model calls of a synthesis run, each answered as JSON under a schema.

:class:`EngineEditor` asks the served model (``model.complete``), with the
structured-outputs constraint (docs/structured-outputs.md), so every answer parses. A run's
stages only see the :class:`Editor` protocol; tests give them a scripted one.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from mlxrt.serving import ServedModel

__all__ = ["Editor", "EngineEditor", "Entity", "Outline", "EXTRACT_SCHEMA", "OUTLINE_SCHEMA", "section_schema"]

log = logging.getLogger("mlxrt.memory")

#: Names start and end with a letter or digit, so each has a slug (its file name).
_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9 .'&+-]{0,38}[A-Za-z0-9+]$"}
_SENTENCE = {"type": "string", "pattern": r"^[^\n]{8,160}$"}

EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"entities": {"type": "array", "maxItems": 4, "items": {
        "type": "object",
        "properties": {
            "name": _NAME,
            "kind": {"type": "string", "enum": ["person", "project", "place", "organization", "topic"]},
            "facts": {"type": "array", "minItems": 1, "maxItems": 3, "items": _SENTENCE},
        },
        "required": ["name", "kind", "facts"], "additionalProperties": False}}},
    "required": ["entities"], "additionalProperties": False,
}

OUTLINE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": _SENTENCE,
        "sections": {"type": "array", "minItems": 1, "maxItems": 4,
                     "items": {"type": "string", "pattern": r"^[A-Z][A-Za-z ]{2,30}$"}},
    },
    "required": ["summary", "sections"], "additionalProperties": False,
}


def section_schema(headings: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": {"section": {"type": "string", "enum": list(headings)}},
            "required": ["section"], "additionalProperties": False}


@attrs.frozen
class Entity:
    name: str
    kind: str
    facts: tuple[str, ...]


@attrs.frozen
class Outline:
    summary: str
    sections: tuple[str, ...]


class Editor(Protocol):
    """The model calls a run makes (called on the run's worker thread)."""

    def extract(self, text: str) -> list[Entity]: ...

    def outline(self, title: str, kind: str, facts: Sequence[str]) -> Outline: ...

    def choose_section(self, title: str, headings: Sequence[str], fact: str) -> str: ...


def _entities(value: Any) -> list[Entity]:
    out = []
    for item in (value or {}).get("entities", []):
        facts = tuple(str(f).strip() for f in item.get("facts", []) if str(f).strip())
        if str(item.get("name", "")).strip() and facts:
            out.append(Entity(name=str(item["name"]).strip(), kind=str(item.get("kind", "topic")), facts=facts))
    return out


class EngineEditor:
    """The served model as the editor: greedy, JSON under a schema, thinking off.

    Made on the event loop; its methods run on a worker thread that anyio started (the run's),
    and hop back to the loop for each generation (``anyio.from_thread``).
    """

    #: Token budgets per call: enough for the schemas above, small enough to bound a run.
    EXTRACT_TOKENS = 512
    OUTLINE_TOKENS = 192
    SECTION_TOKENS = 32

    def __init__(self, model: ServedModel) -> None:
        self.model = model

    def extract(self, text: str) -> list[Entity]:
        system = ("You keep a personal wiki. List the named people, projects, places, organizations "
                  "and topics in the conversation below, each with up to three short factual sentences "
                  "the conversation states about it. Answer in JSON.")
        return _entities(self._ask(system, text, EXTRACT_SCHEMA, self.EXTRACT_TOKENS))

    def outline(self, title: str, kind: str, facts: Sequence[str]) -> Outline:
        system = ("You keep a personal wiki. Write a one-sentence summary for a new article and name "
                  "its sections (one to four short headings). Answer in JSON.")
        prompt = f"Article: {title} ({kind})\nKnown facts:\n" + "\n".join(f"- {f}" for f in facts)
        value = self._ask(system, prompt, OUTLINE_SCHEMA, self.OUTLINE_TOKENS)
        if not value:
            return Outline(summary=f"{title} ({kind}).", sections=("Notes",))
        return Outline(summary=value["summary"], sections=tuple(dict.fromkeys(value["sections"])))

    def choose_section(self, title: str, headings: Sequence[str], fact: str) -> str:
        system = "You keep a personal wiki. Pick the section of the article where the fact belongs. Answer in JSON."
        prompt = f"Article: {title}\nSections: {', '.join(headings)}\nFact: {fact}"
        value = self._ask(system, prompt, section_schema(headings), self.SECTION_TOKENS)
        return value["section"] if value else headings[-1]

    def _ask(self, system: str, prompt: str, schema: dict[str, Any], max_tokens: int) -> Any:
        """The JSON answer, or ``None`` when this input can never be answered (it does not fit
        the context or the memory budget): the item is skipped rather than failing every run.
        Other failures (a full queue, an engine error) end the run, to be retried."""
        import anyio.from_thread

        from mlxrt.errors import InvalidRequest, OverBudget

        try:
            return anyio.from_thread.run(self._generate, system, prompt, schema, max_tokens)
        except (InvalidRequest, OverBudget) as exc:
            log.warning("memory: a model call was refused (%s); the item is skipped", exc.message)
            return None

    async def _generate(self, system: str, prompt: str, schema: dict[str, Any], max_tokens: int) -> Any:
        """One constrained generation through the served model's ``complete`` (planned off the
        event loop); ``None`` when the answer was cut before it closed."""
        from mlxrt.api.output_format import json_schema_output
        from mlxrt.records import ChatInput, RequestOptions

        model = self.model
        chat = ChatInput(messages=({"role": "system", "content": system}, {"role": "user", "content": prompt}),
                         template_kwargs={"enable_thinking": False})
        options = RequestOptions(sampling={"temperature": 0.0}, max_tokens=max_tokens,
                                 structured=json_schema_output(schema, param="memory"))
        answer = await model.complete(chat, options, dialect="memory",
                                      request_id=f"memory-{uuid.uuid4().hex[:16]}")
        try:
            return json.loads(answer.content)
        except json.JSONDecodeError:
            log.warning("memory: the model's answer was cut at %d tokens; skipped", max_tokens)
            return None
