"""Gemma 4's vision adapter: images → soft-token embeddings spliced into the prompt.

The chat template writes one ``<|image|>`` per image. :meth:`Gemma4Vision.splice` expands
each into ``<|image>`` + N × ``<|image|>`` + ``<image|>`` (N from the image's size, as
transformers' ``Gemma4Processor`` does), runs the tower (loaded from the checkpoint on the
first image, so text-only sessions never pay for it) and builds the prompt's input
embeddings the way ``Gemma4Model.forward`` does:

* text rows are the token embeddings, image rows the tower's output. mlx-lm's Gemma 4 text
  model multiplies ``input_embeddings`` by ``sqrt(hidden)`` itself, so text rows stay unscaled
  and image rows are divided by it;
* the ids fed beside the embeddings carry pad at image rows: Gemma 4's per-layer inputs are
  looked up from ids, and transformers looks them up with image positions set to pad.

Checkpoints with ``use_bidirectional_attention: "vision"`` (the larger Gemma 4 models) let
each image's soft tokens attend to one another both ways on **sliding** layers, within the
window (transformers' ``create_masks_for_vision_model``; full layers stay causal): the
:class:`~mlxrt.records.SplicedPrompt` carries a ``prefill`` scope that swaps the text model's
masks for that one prefill pass (:func:`vision_masks`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from mlxrt.compat import masks_overridden
from mlxrt.errors import InvalidRequest
from mlxrt.families.gemma4.image_processor import ImageProcessor
from mlxrt.records import ModelInfo, SplicedPrompt

__all__ = ["Gemma4Vision", "tower_files", "vision_masks", "image_blocks"]

log = logging.getLogger("mlxrt.families.gemma4")
_PREFIXES = ("model.vision_tower.", "model.embed_vision.")


def _tensor_names(path: Path) -> list[str]:
    """The tensor names in a safetensors file's header (the data is not read)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(size)) if k != "__metadata__"]


def tower_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files that hold vision-tower tensors (none: no tower)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        names = {f for k, f in weight_map.items() if k.startswith(_PREFIXES)}
        return sorted(folder / n for n in names)
    return [f for f in sorted(folder.glob("*.safetensors"))
            if any(n.startswith(_PREFIXES[0]) for n in _tensor_names(f))]


def _processor_config(folder: Path) -> Mapping[str, Any]:
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = folder / name
        if path.is_file():
            cfg = json.loads(path.read_text())
            return cfg.get("image_processor", cfg) if isinstance(cfg, dict) else {}
    return {}


def _embed_tokens(model: Any) -> Any:
    for chain in (("language_model", "model"), ("model",), ("language_model",)):
        obj = model
        for name in chain:
            obj = getattr(obj, name, None)
        if obj is not None and hasattr(obj, "embed_tokens"):
            return obj.embed_tokens, obj
    raise RuntimeError("cannot find the Gemma 4 text model's embed_tokens")


def image_blocks(ids: Sequence[int], image_id: int | None) -> Any:
    """Per position: the index of the contiguous image-token run it is in, or -1 (text)."""
    import numpy as np

    is_image = np.asarray(ids) == image_id
    starts = is_image & ~np.concatenate([[False], is_image[:-1]])
    return np.where(is_image, np.cumsum(starts) - 1, -1)


@contextlib.contextmanager
def vision_masks(text_model: Any, blocks: Any) -> Iterator[None]:
    """While active, the first forward pass from an empty cache over ``n > 1`` positions gets
    sliding-layer masks ``(causal | same image block) & window``; full layers stay causal."""
    import mlx.core as mx
    import numpy as np

    def override(original: Any) -> Any:
        def make(h: Any, cache: Any) -> Any:
            masks = original(h, cache)
            n = h.shape[1]
            first = cache and cache[0] is not None and getattr(cache[0], "offset", 0) == 0
            if n < 2 or not first or n > len(blocks):
                return masks
            b = blocks[:n]
            i, j = np.arange(n)[:, None], np.arange(n)[None, :]
            same = (b[:, None] == b[None, :]) & (b[:, None] >= 0)
            window = text_model.window_size or n + 1
            sliding = mx.array(((j <= i) | same) & (j > i - window))
            return [sliding if layer.layer_type == "sliding_attention" else m
                    for layer, m in zip(text_model.layers, masks, strict=True)]

        return make

    with masks_overridden(text_model, override):
        yield


class Gemma4Vision:
    """The :class:`~mlxrt.records.VisionAdapter` of one Gemma 4 multimodal checkpoint.

    :param info: The model (its ``config.json``: ``vision_config``, image token ids).
    :param model: A callable giving the loaded text model (the engine's, at splice time).
    """

    def __init__(self, info: ModelInfo, model: Any) -> None:
        cfg, text = info.config, info.config.get("text_config") or {}
        self.folder = Path(info.path)
        self.vision_config = dict(cfg["vision_config"])
        self.image_id = int(cfg.get("image_token_id", 258880))
        self.boi_id = int(cfg.get("boi_token_id", 255999))
        self.eoi_id = int(cfg.get("eoi_token_id", 258882))
        self.pad_id = int(text.get("pad_token_id") or 0)
        self.text_hidden = int(text["hidden_size"])
        self.bidirectional = text.get("use_bidirectional_attention") == "vision"
        self.processor = ImageProcessor.from_config(_processor_config(self.folder), self.vision_config)
        self._model = model
        self._tower: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the tower's weights are in memory (after the first image)."""
        return self._tower is not None

    def tower(self) -> Any:
        """The vision tower, loaded from the checkpoint on first use."""
        with self._lock:
            if self._tower is None:
                import mlx.core as mx

                from mlxrt.families.gemma4.vision import load_tower

                weights: dict[str, Any] = {}
                for path in tower_files(self.folder):
                    tensors = cast("dict[str, mx.array]", mx.load(str(path)))  # a .safetensors file: a dict
                    weights.update({k: v for k, v in tensors.items() if k.startswith(_PREFIXES)})
                self._tower = load_tower(weights, self.vision_config, self.text_hidden)
                log.info("Gemma 4 vision tower loaded (%d tensors)", len(weights))
        return self._tower

    def image_features(self, image: Any) -> Any:
        """One RGB image → ``[soft_tokens, text_hidden]`` embeddings (what transformers'
        ``get_image_features`` gives as ``pooler_output``)."""
        patches = self.processor(image)
        limit = int(self.vision_config.get("position_embedding_size", 10 * 1024))
        if int(patches.positions.max()) >= limit:
            width, height = image.size
            raise InvalidRequest(f"a {width}x{height} image is too elongated for this vision tower (it would "
                                 f"span more than {limit} patches along one side)", code="invalid_image")
        return self.tower()(patches.pixels, patches.positions)

    def splice(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> SplicedPrompt:
        import mlx.core as mx

        places = [i for i, t in enumerate(prompt_ids) if t == self.image_id]
        if len(places) != len(images):
            raise InvalidRequest(f"the prompt has {len(places)} image placeholder(s) for {len(images)} image(s); "
                                 "the chat template must place one <|image|> per image", code="invalid_image")
        embed, text_model = _embed_tokens(self._model())
        scale = float(getattr(text_model, "embed_scale", self.text_hidden**0.5))
        ids: list[int] = []
        feed: list[int] = []
        rows: list[Any] = []  # ("text", start, end) spans of feed, or image feature arrays
        start = 0
        for place, image in zip(places, images, strict=True):
            features = self.image_features(image)
            ids.extend(prompt_ids[start:place])
            ids.append(self.boi_id)
            feed.extend(prompt_ids[start:place])
            feed.append(self.boi_id)
            rows.append(len(feed))
            n = int(features.shape[0])
            ids.extend([self.image_id] * n + [self.eoi_id])
            feed.extend([self.pad_id] * n + [self.eoi_id])
            rows.append(features)
            start = place + 1
        ids.extend(prompt_ids[start:])
        feed.extend(prompt_ids[start:])
        token_rows = embed(mx.array(feed))
        pieces, at = [], 0
        for item in rows:
            if isinstance(item, int):
                pieces.append(token_rows[at:item])
                at = item
            else:
                pieces.append((item / scale).astype(token_rows.dtype))
                at += int(item.shape[0])
        pieces.append(token_rows[at:])
        embeddings = mx.concatenate(pieces, axis=0)
        mx.eval(embeddings)
        prefill = None
        if self.bidirectional:
            blocks = image_blocks(ids, self.image_id)
            prefill = lambda: vision_masks(text_model, blocks)  # noqa: E731
        return SplicedPrompt(ids=tuple(ids), embeddings=embeddings, feed_ids=tuple(feed), images=len(images),
                             prefill=prefill)
