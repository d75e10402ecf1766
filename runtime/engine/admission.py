"""Admission: decide how many tokens a request may generate before it reaches the engine.

Today the ceiling is the model's context window; the memory-budget contract of the engine
issue tightens it. The error text is mlx-bun's, so clients that parse it keep working.
"""

from __future__ import annotations

from mlxrt.errors import OverBudget

__all__ = ["plan_max_tokens"]


def plan_max_tokens(prompt_tokens: int, requested: int | None, default: int, context: int | None) -> int:
    """Tokens to generate at most.

    :param prompt_tokens: The prompt's length.
    :param requested: The client's ``max_tokens`` (explicit: refused if it cannot fit).
    :param default: The server default (capped to what fits, so long prompts still work).
    :param context: The ceiling on prompt + generation, or ``None`` when unknown.
    :raises OverBudget: When the request cannot fit.
    """
    if context is None:
        return requested if requested is not None else default
    wanted = requested if requested is not None else min(default, max(context - prompt_tokens, 0))
    if prompt_tokens + max(wanted, 1) > context:
        raise OverBudget(
            f"request needs {prompt_tokens + max(wanted, 1)} tokens of context (prompt {prompt_tokens} + "
            f"max_tokens {max(wanted, 1)}) but the memory budget caps safe context at {context} — "
            "shorten the prompt or lower max_tokens",
            code="context_over_budget",
        )
    return wanted
