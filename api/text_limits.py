"""The overlong-body check: a generation body whose text alone cannot fit the context of the
model that would serve it is refused (400, the context-length error) before anything templates
or tokenizes it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Request

from mlxrt.errors import ContextOverflow, OverBudget

if TYPE_CHECKING:
    from mlxrt.serving import ServedModel

__all__ = ["MAX_CHARS_PER_TOKEN", "MAX_IDS_WITHOUT_CONTEXT", "refuse_overlong_text", "check_text_length",
           "refuse_overlong_ids"]

#: Characters one token covers at most, generously (tokens of long whitespace runs reach a
#: few dozen): a body with more prompt text than ``context_ceiling`` × this cannot fit, so it
#: is refused before templating and tokenizing it (a 50 MB body took a minute and gigabytes).
MAX_CHARS_PER_TOKEN = 32
#: Token ids a body may carry for a model whose context is unknown (``/detokenize``).
MAX_IDS_WITHOUT_CONTEXT = 1_000_000


async def refuse_overlong_text(request: Request[Any, Any, Any], body: Any, model: ServedModel) -> None:
    """Refuse (400, the context-length error) a generation body whose text alone is too long
    for the context of the model that would serve it, before anything templates or tokenizes it."""
    ceiling = model.context_ceiling
    if ceiling is not None and len(await request.body()) > ceiling * MAX_CHARS_PER_TOKEN:  # else none can be
        check_text_length(body, ceiling, window=model.info.context_window)


def check_text_length(body: Any, ceiling: int, *, window: int | None = None) -> None:
    """Raise :class:`ContextOverflow` when the strings of ``body`` (inline ``data:`` URLs, images
    and files, left out) hold more than ``ceiling`` tokens can cover (``window``: the model's
    own context window, named when ``ceiling`` is the memory budget's)."""
    total, stack = 0, [body]
    while stack:  # iterative: bodies may nest as deep as the JSON parser allowed
        item = stack.pop()
        if isinstance(item, str):
            if not item.startswith("data:"):
                total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if total > ceiling * MAX_CHARS_PER_TOKEN:
        # Not tokenized (that is what this check spares): the prompt holds at least this many tokens.
        raise ContextOverflow(max(total // MAX_CHARS_PER_TOKEN, ceiling + 1), ceiling, window=window, at_least=True)


def refuse_overlong_ids(count: int, model: ServedModel, *, param: str = "tokens") -> None:
    """Refuse (400, the context-length error) ``count`` token ids that no context of ``model``
    could hold (``/detokenize``): decoding holds the interpreter's lock, so a body of millions
    of ids would stall every other request."""
    ceiling = model.context_ceiling
    limit = ceiling if ceiling is not None else MAX_IDS_WITHOUT_CONTEXT
    if count > limit:
        raise OverBudget(f"{param} has {count} ids but the context holds {limit}", code="context_over_budget")
