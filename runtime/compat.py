"""Every place mlxrt reaches into a dependency's private names, in one fence.

mlx, mlx-lm and uvicorn do not promise their underscored names; an upgrade may rename or
remove any of them without notice. Each touch lives here, once, with a test in
tests/test_compat.py that fails by name when the dependency changes, so an upgrade fails
``test_compat.py::test_<touch>`` instead of silently breaking (for example) batched LoRA.
Nothing outside this module may touch a private name of mlx, mlx-lm, uvicorn or Litestar.

The pin in pyproject.toml (``mlx-lm``) names the versions these tests were run against.
One more contract with mlx-lm lives outside (it uses only public names): the batch lane's
``RowTag`` rides in ``BatchGenerator``'s cache lists (:mod:`mlxrt.engine.lanes`); its test is here too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "MLX_LAUNCH_CODE",
    "forget_captured_signals",
    "hf_tokenizer",
    "masks_overridden",
]

#: ``mlx.launch`` as a ``python -c`` program: its module (mlx's private ``_distributed_utils``)
#: has no ``__main__`` guard, so the entry point the ``mlx.launch`` script calls is called.
MLX_LAUNCH_CODE = "from mlx._distributed_utils.launch import main; main()"


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's ``TokenizerWrapper`` (its ``_tokenizer``), or
    the one mlxrt's own :class:`~mlxrt.text.tokenizer.TextTokenizer` loads on first use (this
    imports transformers); any other object is returned as it is."""
    build = getattr(tokenizer, "transformers_tokenizer", None)
    if build is not None:
        return build()
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
