"""What a grammar may ask of the compiler, checked before any work (docs/structured-outputs.md,
*Limits*).

llguidance compiles recursively: a JSON schema whose ``$ref`` chain is ~3,000 deep, or a GBNF
grammar of ~6,000 chained rules, overflows the stack of the thread and kills the process (a
segfault, not an exception); GBNF conversion is superlinear in rules (3,000 rules: 18 s), and a
``choice`` of 100,000 entries runs for a minute before the library panics. These checks walk
the constraint in Python, iteratively, in time linear in its size, and refuse what is past the
limits with a 400 that names the limit. What they bound:

- the constraint's text (every kind);
- a JSON schema's nodes (every object and array in it, which bounds any chain through
  ``$ref``s, since a chain passes distinct nodes), its ``$ref``s, its ``enum`` members and its
  counted lengths (``minLength``, ``maxItems``…, and repetitions in ``pattern``);
- a regex's counted repetitions (``{n,m}``), nested ones multiplied;
- GBNF and Lark rules, and the schemas a Lark grammar embeds (``%json``: forced tool calls);
- a ``choice`` list's entries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from mlxrt.errors import InvalidRequest
from mlxrt.records import StructuredOutput

__all__ = ["GrammarLimits", "check_limits", "check_schema", "check_regex"]


@attrs.frozen
class GrammarLimits:
    """The bounds a constraint is checked against (the defaults are the server's)."""

    #: Characters of the constraint's canonical text (a schema as compact JSON, a grammar).
    max_chars: int = 256 * 1024
    #: Characters of a Lark grammar (forced tool calls: every tool's schema, which clients such
    #: as coding agents send by the dozen).
    max_lark_chars: int = 1024 * 1024
    #: Objects and arrays in one JSON schema (a chain through ``$ref``s passes distinct nodes,
    #: so this bounds its depth too: ~3,000 crashed an 8 MB stack, the compile thread has 256 MB).
    max_schema_nodes: int = 10_000
    #: ``$ref`` occurrences in one schema.
    max_refs: int = 1_000
    #: ``enum`` members in one schema, all enums together (one row of alternatives: llguidance
    #: refuses rows past 2,000 items).
    max_enum: int = 1_000
    #: Entries of a ``choice`` list.
    max_choices: int = 1_000
    #: GBNF rules (conversion is superlinear: 1,000 rules ~0.1 s, 3,000 ~0.5 s, 20,000 > 90 s).
    max_gbnf_rules: int = 1_000
    #: Lark rules (forced tool calls over many tools make a few per parameter).
    max_lark_rules: int = 10_000
    #: A counted repetition (``{n,m}`` in a regex or ``pattern``, ``minLength``/``maxLength``,
    #: ``minItems``/``maxItems``, ``minProperties``/``maxProperties``), nested ones multiplied.
    max_repeat: int = 100_000


DEFAULT_LIMITS = GrammarLimits()

#: Schema keywords whose value is a count the grammar spells out as a repetition.
_COUNTED = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
#: A counted repetition in a regex: ``{n}``, ``{n,}``, ``{n,m}`` (an escaped brace is literal).
_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_GBNF_RULE = re.compile(r"::=")
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w.]*\s*(?:\{[^}]*\})?\s*(?:\.\s*-?\d+\s*)?:", re.MULTILINE)
_LARK_JSON = re.compile(r"%json\s*(\{.*)$", re.MULTILINE)


def _refuse(structured: StructuredOutput, what: str) -> InvalidRequest:
    return InvalidRequest(f"{structured.param}: {what}", param=structured.param.split(".")[0],
                          code="grammar_too_large")


def check_limits(structured: StructuredOutput, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """Raise a 400 (:class:`InvalidRequest`, code ``grammar_too_large``) when ``structured`` is
    past ``limits``; linear in its size, and nothing is compiled."""
    spec, kind = structured.spec, structured.kind
    most = limits.max_lark_chars if kind == "lark" else limits.max_chars
    if len(spec) > most:
        raise _refuse(structured, f"the constraint is {len(spec)} characters; at most {most}")
    try:
        if kind == "json_schema":
            check_schema(json.loads(spec), limits)
        elif kind == "regex":
            check_regex(spec, limits)
        elif kind == "choice":
            entries = json.loads(spec)
            if len(entries) > limits.max_choices:
                raise ValueError(f"{len(entries)} choices; at most {limits.max_choices}")
        elif kind == "gbnf":
            rules = len(_GBNF_RULE.findall(spec))
            if rules > limits.max_gbnf_rules:
                raise ValueError(f"the grammar has {rules} rules; at most {limits.max_gbnf_rules}")
            check_regex(spec, limits)
        elif kind == "lark":
            rules = len(_LARK_RULE.findall(spec))
            if rules > limits.max_lark_rules:
                raise ValueError(f"the grammar has {rules} rules; at most {limits.max_lark_rules}")
            for m in _LARK_JSON.finditer(spec):  # the schemas of a forced tool call's arguments
                check_schema(json.loads(m.group(1)), limits)
    except ValueError as exc:  # json.JSONDecodeError included: the spec is ours, but be safe
        raise _refuse(structured, str(exc)) from None


def check_schema(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """Raise ``ValueError`` when a JSON schema is past ``limits`` (iterative: any depth)."""
    nodes = refs = members = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            nodes += 1
            if "$ref" in node:
                refs += 1
            enum = node.get("enum")
            if isinstance(enum, list):
                members += len(enum)
            for key in _COUNTED:
                value = node.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool) and value > limits.max_repeat:
                    raise ValueError(f"{key} is {value}; at most {limits.max_repeat}")
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                check_regex(pattern, limits)
            stack.extend(v for k, v in node.items() if k not in ("enum", "const", "default", "examples"))
        elif isinstance(node, list):
            nodes += 1
            stack.extend(node)
        else:
            continue
        if nodes > limits.max_schema_nodes:
            raise ValueError(f"the schema has more than {limits.max_schema_nodes} objects and arrays")
    if refs > limits.max_refs:
        raise ValueError(f"the schema has {refs} $refs; at most {limits.max_refs}")
    if members > limits.max_enum:
        raise ValueError(f"the schema's enums have {members} members; at most {limits.max_enum}")


def check_regex(pattern: str, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """Raise ``ValueError`` when a counted repetition in ``pattern`` (nested ones multiplied,
    by the groups that enclose them) is past ``limits.max_repeat``."""
    # The product along the enclosing groups: a stack of the counts of the groups still open;
    # a group's count is known only at its close, so bound it by the product with the counts
    # seen inside it (generous, and linear).
    inner: list[int] = [1]
    escaped = False
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            inner.append(1)
        elif c == ")" and len(inner) > 1:
            body = inner.pop()
            m = _REPEAT.match(pattern, i + 1)
            count = _count(m) if m else 1
            total = body * count
            if total > limits.max_repeat:
                raise ValueError(f"a repetition of {total}; at most {limits.max_repeat}")
            inner[-1] = max(inner[-1], total)
        elif c == "{":
            m = _REPEAT.match(pattern, i)
            if m and (i == 0 or pattern[i - 1] != ")"):
                count = _count(m)
                if count > limits.max_repeat:
                    raise ValueError(f"a repetition of {count}; at most {limits.max_repeat}")
                inner[-1] = max(inner[-1], count)
        i += 1


def _count(m: re.Match[str]) -> int:
    def number(digits: str) -> int:
        digits = digits.lstrip("0")
        # a count of more than 9 digits is past any limit (and may be past int()'s digit limit)
        return 0 if not digits else int(digits) if len(digits) <= 9 else 10**10
    return max(number(m.group(1)), number(m.group(2) or ""))
