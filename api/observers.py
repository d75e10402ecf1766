"""Turn observers: a chat answer, once complete, told to ``mlxrt_turn_finished`` plugins off
the event loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mlxrt.assembly import ResponseAssembler
from mlxrt.records import FinishedTurn, FinishReason

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost
    from mlxrt.serving import ServedModel

__all__ = ["turn_observer", "observers"]

def turn_observer(host: PluginHost, model: ServedModel, *, dialect: str, request_id: str,
                  messages: Sequence[Mapping[str, Any]], caller: str = "", store: bool = True
                  ) -> Callable[[ResponseAssembler, FinishReason], None] | None:
    """The ``on_finish`` of a chat request's :class:`ResponseAssembler`: reports the answered
    turn to ``mlxrt_turn_finished`` observers (``None`` when no plugin observes turns), with
    who asked (``caller``) and whether the client lets it be kept (``store``); the observers
    are given ``model``, the model that answered.

    Observers run off the event loop, on the host's one observer thread (in the order turns
    finish); an observer's failure is logged, never raised (:meth:`mlxrt.registry.PluginHost.notify`):
    the client's answer is already complete.
    """
    if not host.pm.hook.mlxrt_turn_finished.get_hookimpls():
        return None

    def report(assembler: ResponseAssembler, reason: FinishReason) -> None:
        if reason == FinishReason.CANCELLED:
            return
        turn = FinishedTurn(dialect=dialect, request_id=request_id, model=model.info.model_id,
                            messages=tuple(messages), content="".join(assembler.content),
                            reasoning="".join(assembler.reasoning), tool_calls=assembler.tool_calls,
                            finish_reason=reason, caller=caller, store=store)
        observers(host).submit(host.notify, "mlxrt_turn_finished", turn=turn, host=host, model=model)

    return report


def observers(host: PluginHost) -> Any:
    """The host's thread for ``mlxrt_turn_finished`` observers (one, so turns are told in order)."""
    return host.plugin_state("mlxrt.turn_observers",
                             lambda: ThreadPoolExecutor(1, thread_name_prefix="mlxrt-turn-observers"))
