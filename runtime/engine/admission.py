"""Admission: decide how many tokens a request may generate before it reaches the engine.

The ceiling is the model's context window, tightened by the memory budget's safe context; a
request for several choices (OpenAI's ``n``) shares the budget among them, and asks for no
more choices than the engine admits at once. The error text is mlx-bun's, so clients that
parse it keep working.
"""

from __future__ import annotations

from mlxrt.errors import InvalidRequest, OverBudget

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
                    choices: int = 1) -> int:
    """Tokens to generate at most (per choice).

    :param prompt_tokens: The prompt's length.
    :param requested: The client's ``max_tokens`` (explicit: refused if it cannot fit).
    :param default: The server default (capped to what fits, so long prompts still work).
    :param context: The ceiling on prompt + generation, or ``None`` when unknown (for several
        choices, :func:`choice_ceiling`).
    :param choices: How many choices share the budget (named in the error).
    :raises OverBudget: When the request cannot fit.
    """
    if context is None:
        return requested if requested is not None else default
    wanted = requested if requested is not None else min(default, max(context - prompt_tokens, 0))
    if prompt_tokens + max(wanted, 1) > context:
        raise OverBudget(
            f"request needs {prompt_tokens + max(wanted, 1)} tokens of context (prompt {prompt_tokens} + "
            f"max_tokens {max(wanted, 1)}) but the memory budget caps safe context at {context}"
            + (f" for each of its n={choices} choices" if choices > 1 else "")
            + " — shorten the prompt or lower max_tokens" + (" or n" if choices > 1 else ""),
            code="context_over_budget",
        )
    return wanted
