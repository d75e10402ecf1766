"""The seam through which the engine loads a model: what it asks of model loading.

The engine runs the load on its worker thread (MLX arrays belong to the stream that made them),
but it does not import :mod:`mlxrt.loading`: whoever builds an engine hands it a
:class:`ModelLoader` (:class:`mlxrt.loading.Loader`), so imports run one way, loading → engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mlxrt.records import FamilyProfile, LoadedModel, ModelInfo

__all__ = ["ModelLoader"]


class ModelLoader(Protocol):
    """Model loading as the engine uses it; each call runs on the engine's worker thread."""

    def load(self, info: ModelInfo, host: Any, model: object = None) -> tuple[LoadedModel, FamilyProfile]:
        """The served model: weights through the family hooks, cast and on the kernel, and its
        family profile (:func:`mlxrt.loading.load_model`); ``model`` is the served model being
        loaded, handed to the family hooks that declare it."""
        ...

    def load_draft(self, model: str, host: Any) -> tuple[LoadedModel, ModelInfo]:
        """``--draft-model``'s weights (no profile: it only drafts tokens) and its facts
        (:func:`mlxrt.loading.load_draft`)."""
        ...
