"""Ollama's embeddings: ``POST /api/embed`` (``input``: a string or strings → ``embeddings``)
and the older ``POST /api/embeddings`` (``prompt`` → ``embedding``), served by an embedding
model (Qwen3-Embedding) with :mod:`mlxrt.engine.embedding`'s pooling, as ``/v1/embeddings``.

``truncate`` (default true, as Ollama's) cuts an input longer than the context to fit instead
of refusing it (400).
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response, post

from mlxrt.api.disconnect import off_loop, until_disconnect
from mlxrt.api.wire import FieldRule, check_fields, parse_json_object
from mlxrt.errors import InvalidRequest
from mlxrt.plugins.ollama.residency import chosen
from mlxrt.plugins.ollama.schemas import EMBED, EMBEDDINGS, opt
from mlxrt.plugins.ollama.wire import keep_alive_seconds, ollama_name, pool_name

__all__ = ["embed", "embeddings"]

_RULES = (
    FieldRule("model", (str,)),
    FieldRule("truncate", (bool,)),
    FieldRule("dimensions", (int,), min=1),
    FieldRule("options", (dict,)),
    FieldRule("keep_alive", (str, int, float)),
    FieldRule("prompt", (str,)),
)


def _ids(tokenizer: Any, texts: list[str], end_id: int, context: int | None, truncate: bool) -> list[list[int]]:
    from mlxrt.engine.embedding import ended_inputs

    ids = [list(tokenizer.encode(text)) for text in texts]
    if truncate and context is not None:
        ids = [row if len(row) <= context else row[: context - 1] for row in ids]
    return ended_inputs(ids, end_id, context)


async def _vectors(request: Request[Any, Any, Any], body: dict[str, Any], texts: list[str]) -> tuple[Any, list[Any], int, int]:
    """``(model, vectors, prompt tokens, load nanoseconds)`` for ``texts``."""
    from mlxrt.engine.embedding import embed_ids, end_token_id, hidden_size

    check_fields(body, _RULES)
    model, loaded = await chosen(request, pool_name(body.get("model")), keep_alive_seconds(body.get("keep_alive")))
    info = model.info
    if not model.capabilities.embeddings:
        raise InvalidRequest(f'"{ollama_name(info.model_id)}" does not support embeddings: serve an embedding model '
                             "(e.g. Qwen3-Embedding)", param="model")
    dimensions = body.get("dimensions")
    width = hidden_size(info)
    if dimensions is not None and width is not None and dimensions > width:
        raise InvalidRequest(f"dimensions must be at most {width}", param="dimensions")
    end_id = end_token_id(info, model.tokenizer)
    ids = await off_loop(request, _ids, model.tokenizer, texts, end_id, info.context_window,
                         body.get("truncate") is not False)
    vectors = await until_disconnect(request, model.call(lambda loaded: embed_ids(loaded, ids, dimensions=dimensions)))
    return model, list(vectors), sum(len(i) for i in ids), loaded


@post("/api/embed", status_code=200, opt=opt(EMBED), summary="Embed inputs (Ollama)", tags=["ollama"])
async def embed(request: Request[Any, Any, Any]) -> Response[Any]:
    started = time.monotonic_ns()
    body = parse_json_object(await request.body())
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise InvalidRequest("input: must be a non-empty string or a list of non-empty strings", param="input")
    model, vectors, tokens, loaded = await _vectors(request, body, texts)
    return Response(content={"model": ollama_name(model.info.model_id), "embeddings": [v.tolist() for v in vectors],
                             "total_duration": time.monotonic_ns() - started, "load_duration": loaded,
                             "prompt_eval_count": tokens}, status_code=200)


@post("/api/embeddings", status_code=200, opt=opt(EMBEDDINGS), summary="Embed a prompt (Ollama, older)", tags=["ollama"])
async def embeddings(request: Request[Any, Any, Any]) -> Response[Any]:
    body = parse_json_object(await request.body())
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidRequest("prompt: must be a string", param="prompt")
    if not prompt:  # Ollama answers an empty prompt with an empty vector (a body still checked)
        check_fields(body, _RULES)
        keep_alive_seconds(body.get("keep_alive"))
        return Response(content={"embedding": []}, status_code=200)
    _model, vectors, _tokens, _loaded = await _vectors(request, body, [prompt])
    return Response(content={"embedding": vectors[0].tolist()}, status_code=200)
