"""Text embeddings from a decoder checkpoint: which models are embedding models, and the pooled,
L2-normalized vectors they give.

An embedding model here is a Qwen3-Embedding-style checkpoint: the hidden state of the last
token after the final norm, L2-normalized, with ``<|endoftext|>`` ending every input. A
checkpoint is taken for one when either

* its sentence-transformers files say so: ``modules.json`` names a ``Pooling`` module whose
  ``config.json`` has ``pooling_mode_lasttoken: true`` (the official Qwen3-Embedding repos); or
* ``config.json``'s ``architectures`` is ``Qwen3Model`` (a bare encoder with no LM head).

Queries use Qwen3-Embedding's instruction format (:func:`query_text`); documents are embedded
as they are. The forward runs through ``Engine.call`` on the engine's worker thread
(:func:`embed_ids`); tokenizing (:func:`encode_inputs`) may run anywhere.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxrt.errors import EngineError, InvalidRequest
from mlxrt.records import LoadedModel, ModelInfo

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "EMBEDDING_ARCHITECTURES",
    "is_embedding_model",
    "query_text",
    "end_token_id",
    "encode_inputs",
    "ended_inputs",
    "embed_ids",
    "hidden_size",
    "plan_batches",
    "MAX_BATCH_TOKENS",
    "MAX_PADDING",
]

#: ``architectures`` values that mark a checkpoint as an encoder-only (embedding) model.
EMBEDDING_ARCHITECTURES = frozenset({"Qwen3Model"})
#: Padded tokens per forward: bounds the activations one batch holds (rows x longest input).
MAX_BATCH_TOKENS = 8192
#: Padding one batch may carry, as a fraction of its real tokens.
MAX_PADDING = 0.25
#: The token Qwen3-Embedding ends every input with; its hidden state is the embedding.
END_TOKEN = "<|endoftext|>"


def is_embedding_model(info: ModelInfo) -> bool:
    """Whether ``info`` is a last-token-pooling embedding model (see the module docstring)."""
    architectures = info.config.get("architectures") or ()
    if any(a in EMBEDDING_ARCHITECTURES for a in architectures):
        return True
    return info.path is not None and _last_token_pooling(str(info.path))


@functools.lru_cache(maxsize=32)
def _last_token_pooling(folder: str) -> bool:
    """modules.json → the Pooling module's config says ``pooling_mode_lasttoken``."""
    root = Path(folder)
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        for module in modules:
            if str(module.get("type", "")).endswith(".Pooling"):
                pooling = json.loads((root / module.get("path", "") / "config.json").read_text(encoding="utf-8"))
                return pooling.get("pooling_mode_lasttoken") is True
    except (OSError, ValueError, TypeError, AttributeError):  # absent or malformed: not one
        return False
    return False


def query_text(text: str, instruction: str | None) -> str:
    """Qwen3-Embedding's query format; without an instruction the text is a document."""
    return text if instruction is None else f"Instruct: {instruction}\nQuery:{text}"


def end_token_id(info: ModelInfo, tokenizer: Any) -> int:
    """The id every input must end with: ``<|endoftext|>``, else the tokenizer's EOS."""
    eot = info.special_tokens.get(END_TOKEN)
    if eot is None:
        eot = tokenizer.eos_token_id
    if eot is None:
        raise EngineError(f"{info.model_id} has neither {END_TOKEN} nor an EOS token to pool on")
    return int(eot)


def encode_inputs(tokenizer: Any, texts: Sequence[str], end_id: int, context: int | None) -> list[list[int]]:
    """Token ids per text, each ending with ``end_id`` exactly once.

    The updated official tokenizer appends ``<|endoftext|>`` itself (a post-processor); older
    ones do not, so it is appended when missing rather than encoded without special tokens.

    :raises InvalidRequest: An input longer than the model's context window.
    """
    return ended_inputs([list(tokenizer.encode(text)) for text in texts], end_id, context)


def ended_inputs(inputs: Sequence[Sequence[int]], end_id: int, context: int | None) -> list[list[int]]:
    """Token ids per input (a tokenized text, or ids the client sent), each ending with
    ``end_id`` exactly once (appended when missing: pooling reads that token).

    :raises InvalidRequest: An input longer than the model's context window.
    """
    out = []
    for i, given in enumerate(inputs):
        ids = list(given)
        if not ids or ids[-1] != end_id:
            ids.append(end_id)
        if context is not None and len(ids) > context:
            raise InvalidRequest(f"input {i} has {len(ids)} tokens, more than the model's context of {context}",
                                 param="input")
        out.append(ids)
    return out


def plan_batches(lengths: Sequence[int], *, max_batch_tokens: int = MAX_BATCH_TOKENS,
                 max_padding: float = MAX_PADDING) -> list[list[int]]:
    """Group input indices into forward batches: shortest first, each batch's padded size
    (rows x longest) within ``max_batch_tokens`` and its padding within ``max_padding`` of its
    real tokens. An input longer than the budget runs alone.

    The padding bound matters on CPU, where a forward costs per padded token and batching
    gains nothing; on a GPU similar lengths still share one forward.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    batch: list[int] = []
    real = 0
    for i in order:
        n = lengths[i]  # the longest so far: lengths arrive in ascending order
        rows = len(batch) + 1
        if batch and (n * rows > max_batch_tokens or n * rows - (real + n) > max_padding * (real + n)):
            batches.append(batch)
            batch, real = [], 0
        batch.append(i)
        real += n
    if batch:
        batches.append(batch)
    return batches


def embed_ids(loaded: LoadedModel, inputs: Sequence[Sequence[int]], *, dimensions: int | None = None,
              max_batch_tokens: int = MAX_BATCH_TOKENS) -> np.ndarray:
    """Pooled, L2-normalized embeddings, one float32 row per input, in input order.

    Runs MLX: call it on the engine's worker (``await engine.call(lambda m: embed_ids(m, ids))``).
    Inputs run in right-padded batches of similar length (:func:`plan_batches`): under the causal mask no
    real token attends to the padding after it, so the last real token's hidden state (and its
    RoPE position) is the one an unpadded forward gives. ``dimensions`` keeps the first that
    many components (Matryoshka) and renormalizes.
    """
    import mlx.core as mx
    import numpy as np  # here: a server of a text model never imports it

    encoder = getattr(loaded.model, "model", None)
    if encoder is None:
        raise EngineError("this model has no inner encoder (model.model) to take hidden states from")
    rows: list[np.ndarray | None] = [None] * len(inputs)
    for batch in plan_batches([len(i) for i in inputs], max_batch_tokens=max_batch_tokens):
        longest = max(len(inputs[i]) for i in batch)
        padded = np.zeros((len(batch), longest), dtype=np.int32)
        for r, i in enumerate(batch):
            padded[r, : len(inputs[i])] = inputs[i]
        hidden = encoder(mx.array(padded))
        last = mx.array(np.array([len(inputs[i]) - 1 for i in batch], dtype=np.int32))
        pooled = hidden[mx.arange(len(batch)), last].astype(mx.float32)
        if dimensions is not None:
            pooled = pooled[:, :dimensions]
        pooled = pooled / mx.linalg.norm(pooled, axis=-1, keepdims=True)
        vectors = np.array(pooled)
        for r, i in enumerate(batch):
            rows[i] = vectors[r]
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack(rows).astype(np.float32, copy=False)


def hidden_size(info: ModelInfo) -> int | None:
    """The embedding width: ``hidden_size`` of the (text) config."""
    for cfg in (info.config, info.config.get("text_config") or {}):
        value = cfg.get("hidden_size") if isinstance(cfg, Mapping) else None
        if isinstance(value, int):
            return value
    return None
