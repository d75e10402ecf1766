"""Admission: decide how many tokens a request may generate before it reaches the engine.

The ceiling is the model's context window, tightened by the memory budget's safe context; a
request for several choices (OpenAI's ``n``) shares the budget among them, and asks for no
more choices than the engine admits at once. A ``max_tokens`` larger than what fits is
reduced to it (every dialect alike); only a prompt that does not fit by itself is refused,
with :class:`~mlxrt.errors.ContextOverflow`, the error agent clients recognise as overflow.
"""

from __future__ import annotations

from mlxrt.errors import ContextOverflow, InvalidRequest

__all__ = ["plan_max_tokens", "choice_ceiling", "check_choices", "MAX_CHOICES"]

#: Choices one request may ask for at most, whatever the engine's rows and queue.
MAX_CHOICES = 128


def check_choices(n: int, rows: int, max_queue: int) -> None:
    """Refuse (400) ``n`` choices beyond :data:`MAX_CHOICES` or beyond what the engine holds at
    once (its ``rows`` decoding plus ``--max-queue`` waiting): each choice is an engine
    request, and a request must never fill the queue with itself."""
    limit = min(MAX_CHOICES, rows + max_queue)
    if n > limit:
        why = (f"this server admits {limit} requests at once (--batch {rows} + --max-queue {max_queue})"
               if limit < MAX_CHOICES else f"at most {MAX_CHOICES} choices per request")
        raise InvalidRequest(f"n must be at most {limit}: {why}", param="n")


def choice_ceiling(context_window: int | None, safe_context: int | None, n: int) -> int | None:
    """The ceiling on prompt + generation of each of ``n`` choices: the context window, and
    the memory budget's safe context shared among the choices (they run side by side, each
    with its own copy of the prompt's KV)."""
    share = safe_context // n if safe_context is not None else None
    limits = [c for c in (context_window, share) if c is not None]
    return min(limits) if limits else None


def plan_max_tokens(prompt_tokens: int, requested: int | None, default: int, context: int | None,
                    choices: int = 1, window: int | None = None) -> int:
    """Tokens to generate at most (per choice): the client's ``max_tokens`` (or, without one,
    the server's default), reduced to what the context leaves after the prompt. A generation
    that fills the context ends with ``length``, as llama-server's and Ollama's do, so clients
    that send a large ``max_tokens`` by default (agent CLIs send 32,000 or more) get answers.

    :param prompt_tokens: The prompt's length.
    :param requested: The client's ``max_tokens`` (``None``: not given).
    :param default: The server default.
    :param context: The ceiling on prompt + generation, or ``None`` when unknown (for several
        choices, :func:`choice_ceiling`).
    :param choices: How many choices share the budget (named in the error).
    :param window: The model's own context window, named in the error when ``context`` is tighter.
    :raises ContextOverflow: When the prompt alone leaves no room for one token.
    """
    wanted = requested if requested is not None else default
    if context is None:
        return wanted
    if prompt_tokens + 1 > context:
        raise ContextOverflow(prompt_tokens, context, window=window, choices=choices)
    return min(wanted, context - prompt_tokens)
