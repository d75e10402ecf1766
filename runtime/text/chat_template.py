"""Chat templates rendered the way ``transformers`` renders them, without importing it.

A model's template is Jinja written against transformers' environment
(``transformers/utils/chat_template_utils.py``): a sandbox with ``trim_blocks``,
``lstrip_blocks``, ``loopcontrols`` and the ``{% generation %}`` tag, its own ``tojson`` (no
HTML escaping, ``ensure_ascii=False``), ``raise_exception``, ``strftime_now`` and guarded
``dict`` / ``namespace``. The same template over the same input must give the same bytes, so
everything here copies that environment and the input preparation (``None`` keys dropped,
reasoning aliased under ``reasoning_content`` / ``thinking``, values rebuilt from plain JSON
types) and raises the same exception types with the same texts; tests/test_tokenizer_parity.py
compares the two byte for byte.

One thing differs on purpose: a rendering is bounded. Transformers lets a template loop over
``range(100000)`` twice for hours (its worker thread spinning after the client left, SIGTERM
waiting on it); here a rendering past :data:`RENDER_TIME_LIMIT` seconds or
:data:`RENDER_MAX_CHARS` characters of output raises :class:`TemplateLimitError` (a
``TemplateError``: the request gets its 400 ``prompt build failed: …``). The clock is checked
on every call, attribute and item lookup the sandbox sees, every 256 steps of a ``range`` and
every 256 pieces of output, so even an empty nested loop stops in time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.exceptions
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

__all__ = ["ChatTemplates", "RENDER_MAX_CHARS", "RENDER_TIME_LIMIT", "TemplateLimitError", "pick_template",
           "render_chat_template"]

#: Seconds one rendering may take (real templates take milliseconds, long chats included).
RENDER_TIME_LIMIT = 5.0
#: Characters one rendering may produce (a body is at most --max-body-size, 32 MiB by default).
RENDER_MAX_CHARS = 64 << 20

#: A model's templates: one string, or named ones (``default``, ``tool_use``, …).
ChatTemplates = str | Mapping[str, str]

# Names a message's reasoning arrives under; templates read the first (transformers' list).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class TemplateLimitError(jinja2.exceptions.TemplateError):
    """A rendering ran past :data:`RENDER_TIME_LIMIT` or :data:`RENDER_MAX_CHARS`."""


# The deadline of the rendering running on this thread (None: none running).
_clock = threading.local()


def _check_clock() -> None:
    deadline = getattr(_clock, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimitError(f"the chat template took longer than {RENDER_TIME_LIMIT:g} s to render; aborted")


class _TimedRange(Sequence[Any]):
    """The sandbox's ``range`` (at most 100,000 items) that checks the clock as it is iterated."""

    def __init__(self, inner: range) -> None:
        self._inner = inner

    def __len__(self) -> int:
        return len(self._inner)

    def __getitem__(self, index: Any) -> Any:
        item = self._inner[index]
        return _TimedRange(item) if isinstance(item, range) else item

    def __iter__(self) -> Iterator[int]:
        for step, value in enumerate(self._inner):
            if not step & 255:
                _check_clock()
            yield value

    def __repr__(self) -> str:
        return repr(self._inner)


def _timed_range(*args: int) -> _TimedRange:
    return _TimedRange(safe_range(*args))


class _TimedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with the clock checked on every call and lookup."""

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_clock()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_clock()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_clock()
        return super().getitem(obj, argument)


def _render(template: jinja2.Template, **variables: Any) -> str:
    """``template.render(**variables)`` within the limits (see the module docstring)."""
    _clock.deadline = time.monotonic() + RENDER_TIME_LIMIT
    try:
        pieces, size = [], 0
        for piece in template.generate(**variables):
            size += len(piece)
            if size > RENDER_MAX_CHARS:
                raise TemplateLimitError(f"the chat template rendered more than {RENDER_MAX_CHARS} characters; "
                                         "aborted")
            pieces.append(piece)
            if not len(pieces) & 255:
                _check_clock()
        return "".join(pieces)
    finally:
        _clock.deadline = None


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: transformers marks assistant spans with it
    (for training masks); rendering keeps the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        body: str = caller()
        return body


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict`` for templates, without attribute access to the real type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace`` that refuses underscore-prefixed names (a sandbox escape route)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        values = dict(*args, **kwargs)
        for name in values:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, values)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = _TimedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.globals["range"] = _timed_range
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    # A model has one or two templates; --chat-template and tests add a few more.
    return _environment().from_string(source)


def pick_template(templates: ChatTemplates | None, chosen: str | None = None, tools: Any = None) -> str:
    """The template source to render: ``chosen`` (a name among named templates, or a source),
    else the model's (among named ones, ``tool_use`` when tools are given, then ``default``)."""
    if isinstance(templates, Mapping):
        if chosen is not None and chosen in templates:
            return templates[chosen]
        if chosen is None:
            if tools is not None and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ValueError(
                "This model has multiple chat templates with no default specified! Please either pass a chat "
                "template or the name of the template you wish to use to the `chat_template` argument. Available "
                f"template names are {sorted(templates.keys())}."
            )
    elif chosen is None:
        if templates is None:
            raise ValueError(
                "Cannot use chat template functions because tokenizer.chat_template is not set and no template "
                "argument was passed! For information about writing templates and setting the "
                "tokenizer.chat_template attribute, please see the documentation at "
                "https://huggingface.co/docs/transformers/main/en/chat_templating"
            )
        return templates
    return chosen


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types (other objects become ``"<TypeName>"``), so the
    sandbox only ever sees data."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if any(c.__name__ == "generic" and c.__module__ == "numpy" for c in type(value).__mro__):
        return _plain(value.item())  # numpy scalars: np.bool_(False) must stay falsy
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _as_dicts(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _as_dicts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_dicts(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_as_dicts(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _as_dicts(value.model_dump())
    return value


def _normalized(conversation: Any) -> list[dict[str, Any]]:
    """Messages as dicts without ``None``-valued keys (templates handle a missing key, not ``None``)."""
    out = []
    for message in _as_dicts(getattr(conversation, "messages", conversation)):
        if not isinstance(message, dict):
            raise TypeError(f"Chat messages should be dicts, dataclasses or pydantic models, but got {message!r}.")
        out.append({k: v for k, v in message.items() if v is not None})
    return out


def _alias_reasoning(chat: list[Any]) -> list[Any]:
    aliased = []
    for message in chat:
        if isinstance(message, dict):
            reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def render_chat_template(source: str, conversation: Sequence[Any], *, tools: Any = None, documents: Any = None,
                         add_generation_prompt: bool = False, continue_final_message: bool | str = False,
                         variables: Mapping[str, Any] | None = None) -> str:
    """``conversation`` rendered with the template ``source``, as transformers'
    ``apply_chat_template(..., tokenize=False)`` renders one conversation; ``variables`` are
    the rest the template sees (special-token strings, then the caller's keyword arguments).

    :raises ValueError, TypeError, jinja2.TemplateError: As transformers raises them.
    """
    if isinstance(conversation, (list, tuple)) and len(conversation) == 0:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    chat = _normalized(conversation)
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when "
            "you want the model to continue the final message, and add_generation_prompt when you want to add a "
            "header that will prompt it to start a new assistant message instead."
        )
    template = _compile(source)
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, dict):
                raise ValueError(
                    "Tools should either be a JSON schema, or a callable function with type hints "
                    "and a docstring suitable for auto-conversion to a schema."
                )
    if documents is not None:
        for document in documents:
            if not isinstance(document, dict):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    tools, documents, kwargs = _plain(tools), _plain(documents), _plain(dict(variables or {}))
    chat = _plain(chat)
    chat = _alias_reasoning(chat)
    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        if (final := chat[-1].get(field)) is None:
            raise ValueError(f'continue_final_message is set but the final message has no "{field}" to continue!')
        fields = [field]
        if field in _REASONING_FIELDS:
            fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
        if not any(f in source for f in fields):
            raise ValueError(f'continue_final_message is set to "{field}" but this is not an accepted field in '
                             "the chat_template")
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final, block["text"] = block["text"], block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ValueError("continue_final_message is set but we could not find any text to continue in "
                                 "the final message!")
        else:
            for f in fields:
                chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    text = _render(template, messages=chat, tools=tools, documents=documents,
                   add_generation_prompt=add_generation_prompt, **kwargs)
    if continue_final_message:
        assert isinstance(final, str)
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the chat after "
                "applying the chat template! This can happen if the chat template deletes portions of "
                "the final message. Please verify the chat template and final message in your chat to "
                "ensure they are compatible."
                f"Final message to continue: {final.strip()}\nRendered chat:\n{text}"
            )
        at = text.rindex(_CONTINUE_TAG.strip())
        text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
    return text
