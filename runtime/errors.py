"""Typed errors: the runtime raises these, each dialect renders them in its own shape.

Errors are data at the edge (STYLE.md): a handler never builds an error body by hand; it
raises one of these and the dialect's exception handler turns ``status``, ``type``,
``code``, ``param`` and ``message`` into the wire format.
"""

from __future__ import annotations

__all__ = [
    "MlxrtError",
    "InvalidRequest",
    "NotFound",
    "ModelNotFound",
    "ModelUnavailable",
    "OverBudget",
    "ContextOverflow",
    "QueueFull",
    "ModelLoadError",
    "PluginError",
    "EngineError",
    "ShuttingDown",
]


class MlxrtError(Exception):
    """Base of every error mlxrt reports to a client or an operator."""

    status: int = 500
    type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequest(MlxrtError):
    """The client's request is malformed or asks for something impossible (400)."""

    status = 400
    type = "invalid_request_error"


class NotFound(MlxrtError):
    """The route, model or object named by the client does not exist (404)."""

    status = 404
    type = "not_found_error"


class ModelNotFound(NotFound):
    """A request named a model this server does not serve and may not load (404).

    OpenAI's exact text and type (``invalid_request_error``, code ``model_not_found``), so
    clients that special-case it keep working; Anthropic's shape maps it by status to
    ``not_found_error``."""

    type = "invalid_request_error"

    def __init__(self, name: str) -> None:
        super().__init__(f"The model `{name}` does not exist or you do not have access to it.",
                         code="model_not_found")
        self.name = name


class ModelUnavailable(MlxrtError):
    """A served model could not be made resident for this request: its load failed or it
    cannot fit the memory budget beside the resident models (503; the message says which
    model, what it needs and what is resident)."""

    status = 503
    type = "model_unavailable"


class OverBudget(MlxrtError):
    """Admission refused the request: it would not fit the memory budget (400)."""

    status = 400
    type = "memory_admission"


class ContextOverflow(OverBudget):
    """A prompt that does not fit, by itself, the context a request may use (400).

    Only the prompt is refused: a ``max_tokens`` too large for what is left is reduced to it
    (:func:`mlxrt.engine.admission.plan_max_tokens`). The type and code are OpenAI's
    (``invalid_request_error``, ``context_length_exceeded``) and ``message`` is OpenAI's text,
    because agent clients recognise the overflow by them and compact their conversation;
    the Anthropic dialect words it its own way from the fields (``prompt is too long: …``).

    :ivar prompt_tokens: The prompt's length (with ``at_least``: a lower bound, counted from
        the characters of a body too long to tokenize).
    :ivar limit: The context the request may use.
    :ivar window: The model's own context window when ``limit`` is tighter (the memory
        budget's safe context, or its share among ``choices``); ``None`` when ``limit`` is it.
    :ivar choices: How many choices share the budget (OpenAI's ``n``).
    """

    type = "invalid_request_error"

    def __init__(self, prompt_tokens: int, limit: int, *, window: int | None = None, choices: int = 1,
                 at_least: bool = False) -> None:
        self.prompt_tokens, self.limit, self.choices, self.at_least = prompt_tokens, limit, choices, at_least
        self.window = window if window is not None and window != limit else None
        why = f" on this server ({self.why()})" if self.window is not None else ""
        super().__init__(f"This model's maximum context length is {limit} tokens{why}. However, your "
                         f"messages resulted in {'at least ' if at_least else ''}{prompt_tokens} tokens. "
                         "Please reduce the length of the messages.", code="context_length_exceeded")

    def why(self) -> str:
        """What caps the context below the model's window, in words (``""`` when nothing does)."""
        if self.window is None:
            return ""
        shared = f", shared by the request's n={self.choices} choices" if self.choices > 1 else ""
        return f"the server's memory budget{shared}; the model's own window is {self.window} tokens"


class QueueFull(MlxrtError):
    """The engine is at capacity and its wait queue is full, or the request waited longer than
    the request timeout (429). ``retry_after`` (seconds) becomes the ``Retry-After`` header."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int = 1, code: str = "queue_full") -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class ModelLoadError(MlxrtError):
    """The model could not be resolved or loaded (an operator-facing error)."""

    status = 500
    type = "model_load_error"


class EngineError(MlxrtError):
    """Generation failed inside the engine for a reason that is not the client's."""

    status = 500
    type = "server_error"


class PluginError(MlxrtError):
    """A plugin's hook raised; names the plugin and the hook so the fault is traceable."""

    status = 500
    type = "plugin_error"

    def __init__(self, plugin: str, hook: str, cause: BaseException) -> None:
        super().__init__(f"plugin {plugin!r} failed in {hook}: {type(cause).__name__}: {cause}")
        self.plugin = plugin
        self.hook = hook
        self.cause = cause


class ShuttingDown(MlxrtError):
    """The server is shutting down (SIGTERM): a waiting request is refused at once, a running
    one that does not finish within ``--shutdown-grace`` is ended with this error (503)."""

    status = 503
    type = "service_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="shutting_down")
        self.retry_after = 1  # another instance (or this one, restarted) can take the retry
