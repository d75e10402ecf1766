"""Image prompts: decode a request's images and have the family's vision adapter splice them
into the templated prompt, on the engine's worker.

:func:`splice_images` runs where templating runs (a worker thread of the HTTP side, never the
event loop): it fetches and decodes the images there (:mod:`mlxrt.loading.images`), then hands
``adapter.splice`` to the engine's thread (MLX state lives there, and the tower runs
between decode steps, serialized with generation). The :class:`~mlxrt.records.SplicedPrompt`
it returns rides on the :class:`~mlxrt.records.GenerationRequest` (``vision``); the engine
prefills from its embeddings, bypasses the prompt cache and takes the serial lane. The
decoded images are dropped as soon as the tower has run; the embeddings live exactly as long
as the request does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mlxrt.errors import EngineError, MlxrtError
from mlxrt.loading.images import (
    DEFAULT_MAX_PIXELS_IN_FLIGHT,
    ImageLimits,
    ImageRef,
    PixelBudget,
    load_images,
)
from mlxrt.records import FamilyProfile, SplicedPrompt

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = ["splice_images", "pixel_budget"]

log = logging.getLogger("mlxrt.loading.vision")


#: Runs a function on the model's thread, between decode steps (``ServedModel.call_blocking``).
OnModel = Callable[[Callable[[Any], SplicedPrompt]], SplicedPrompt]


def splice_images(host: PluginHost, profile: FamilyProfile, prompt_ids: Sequence[int],
                  refs: Sequence[ImageRef], *, on_model: OnModel | None = None) -> SplicedPrompt:
    """The prompt with ``refs`` decoded, run through the model's tower and spliced in.

    ``on_model`` runs the tower on the model's thread (the served model's ``call_blocking``);
    without it the tower runs here (tests of an adapter alone).

    :raises InvalidRequest: an image is malformed, oversize, unreachable or undecodable
        (naming its request part), or the adapter refuses the prompt.
    :raises QueueFull: the server's pixel budget had no room for the images within
        :data:`mlxrt.loading.images.PIXEL_WAIT_S` (429 ``images_busy``).
    """
    limits = ImageLimits.from_options(host.options)
    with pixel_budget(host, limits).lease() as lease:  # held until the pixels are dropped
        return _splice(profile, prompt_ids, load_images(refs, limits, lease), on_model)


def pixel_budget(host: PluginHost, limits: ImageLimits) -> PixelBudget:
    """The server's :class:`~mlxrt.loading.images.PixelBudget` (one per host, shared by every model),
    ``--max-image-pixels-in-flight`` but never below one request's cap."""
    wanted = host.options.get("max_image_pixels_in_flight") or DEFAULT_MAX_PIXELS_IN_FLIGHT
    return host.plugin_state("images", lambda: PixelBudget(max(int(wanted), limits.max_total_pixels)))


def _splice(profile: FamilyProfile, prompt_ids: Sequence[int], images: list[Any],
            on_model: OnModel | None) -> SplicedPrompt:
    adapter = profile.vision

    def run(_loaded: Any = None) -> SplicedPrompt:
        try:
            spliced = adapter.splice(tuple(prompt_ids), images)
        except MlxrtError:
            raise
        except Exception as exc:
            log.exception("the vision adapter failed")
            raise EngineError(f"image processing failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(spliced, SplicedPrompt):
            raise EngineError(f"the vision adapter returned {type(spliced).__name__}, not a SplicedPrompt")
        if len(spliced.ids) != int(spliced.embeddings.shape[0]):
            raise EngineError(f"the vision adapter gave {spliced.embeddings.shape[0]} embeddings "
                              f"for {len(spliced.ids)} ids")
        return spliced

    try:
        return on_model(run) if on_model is not None else run()
    finally:
        images.clear()  # the pixels are not needed past the tower

