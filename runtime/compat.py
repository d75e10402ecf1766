"""Every place mlxrt reaches into a dependency's private names, in one fence.

mlx, mlx-lm and uvicorn do not promise their underscored names; an upgrade may rename or
remove any of them without notice. Each touch lives here, once, with a test in
tests/test_compat.py that fails by name when the dependency changes, so an upgrade fails
``test_compat.py::test_<touch>`` instead of silently breaking (for example) batched LoRA.
Nothing outside this module may touch a private name of mlx, mlx-lm, uvicorn or Litestar.

The pin in pyproject.toml (``mlx-lm``) names the versions these tests were run against.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "MLX_LAUNCH_CODE",
    "batch_uids",
    "forget_captured_signals",
    "hf_tokenizer",
    "masks_overridden",
]

#: ``mlx.launch`` as a ``python -c`` program: its module (mlx's private ``_distributed_utils``)
#: has no ``__main__`` guard, so the entry point the ``mlx.launch`` script calls is called.
MLX_LAUNCH_CODE = "from mlx._distributed_utils.launch import main; main()"


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's ``TokenizerWrapper`` (its ``_tokenizer``);
    an object without that attribute is returned as it is."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def forget_captured_signals(server: Any) -> None:
    """Make a ``uvicorn.Server`` forget the signals it caught, so that after a graceful
    shutdown it does not re-raise them (which would end the process as "killed").

    uvicorn keeps them in ``Server._captured_signals`` and re-raises each on the way out of
    ``capture_signals``.
    """
    captured = server._captured_signals
    if not isinstance(captured, list):
        raise TypeError(f"uvicorn.Server._captured_signals is a {type(captured).__name__}, not a list")
    captured.clear()


@contextlib.contextmanager
def masks_overridden(text_model: Any, make: Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]]
                     ) -> Iterator[None]:
    """While active, ``text_model._make_masks(h, cache)`` (mlx-lm's Gemma 4 text model builds
    its per-layer attention masks there) is ``make(original)``: an instance attribute shadows
    the method, and is deleted on the way out."""
    original = text_model._make_masks
    text_model._make_masks = make(original)
    try:
        yield
    finally:
        del text_model._make_masks


def batch_uids(generator: Any, cache: Any) -> list[int] | None:
    """The uids, in row order, of the batch of mlx-lm's ``BatchGenerator`` whose model call
    passed ``cache`` (its per-layer cache list); ``None`` when no batch holds it.

    The generator calls the model for its prompt batch (prefill chunks), for its generation
    batch (one decode step), and for the batch being split off into generation, which it
    does not hold yet: that one is the ``GenerationBatch`` whose constructor is making the
    call: the caller of the model wrapper whose ``__call__`` calls this function.
    """
    for batch in (generator._generation_batch, generator._prompt_batch):
        if batch is not None and batch.prompt_cache is cache:
            return list(batch.uids)
    caller = sys._getframe(2).f_locals.get("self")
    if caller is not None and getattr(caller, "prompt_cache", None) is cache and hasattr(caller, "uids"):
        return list(caller.uids)
    return None
