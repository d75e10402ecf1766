"""OpenAI ``POST /v1/embeddings``, served when the model is an embedding model.

The pooling and the model-side rules are :mod:`mlxrt.engine.embedding`'s; this module validates the
request (each input's length before it is tokenized), tokenizes off the event loop (abandoned
when the client leaves), runs one raw forward job on the engine worker and
answers in OpenAI's shape (``float`` lists or ``base64`` little-endian float32). ``input`` is
what OpenAI's API takes: a string, strings, one input as token ids (``[12, 34]``) or several
(``[[12, 34], [56]]``); ids are checked against the model's vocabulary.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from litestar import Request, Response, post

from mlxrt.api.disconnect import off_loop, until_disconnect
from mlxrt.api.models import model_for
from mlxrt.api.text_limits import check_text_length
from mlxrt.api.wire import FieldRule, check_fields, parse_json_object
from mlxrt.engine.embedding import (
    embed_ids,
    encode_inputs,
    end_token_id,
    ended_inputs,
    hidden_size,
    query_text,
)
from mlxrt.errors import InvalidRequest
from mlxrt.plugins.openai.encode import ROUTE_OPT

if TYPE_CHECKING:
    import numpy as np  # the vectors; numpy is imported by the code that makes them

__all__ = ["embeddings", "MAX_INPUTS"]

#: OpenAI's cap on the inputs one request may embed.
MAX_INPUTS = 2048
_INPUT_ERROR = ("`input` must be a string, an array of strings, an array of token ids or an array of "
                "token-id arrays")
_RULES = (
    FieldRule("model", (str,)),
    FieldRule("encoding_format", (str,)),
    FieldRule("dimensions", (int,), min=1),
    FieldRule("instruction", (str,)),
    FieldRule("user", (str,)),
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _inputs(body: dict[str, Any], vocab: int | None) -> list[str] | list[list[int]]:
    """``input`` as texts, or as token-id lists (each id an integer in the vocabulary)."""
    value = body.get("input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequest(_INPUT_ERROR, param="input")
    if all(isinstance(v, str) for v in inputs):
        if not all(inputs):
            raise InvalidRequest(f"{_INPUT_ERROR} (an empty string has nothing to embed)", param="input")
        rows, names = inputs, None
    elif all(_is_number(v) for v in inputs):  # one input, as token ids
        rows, names = [inputs], ["input"]
    elif all(isinstance(v, list) for v in inputs):
        rows, names = inputs, [f"input[{i}]" for i in range(len(inputs))]
    else:
        raise InvalidRequest(f"{_INPUT_ERROR}, not a mix of them", param="input")
    if len(rows) > MAX_INPUTS:
        raise InvalidRequest(f"`input` may hold at most {MAX_INPUTS} inputs", param="input")
    if names is None:
        return rows
    for name, row in zip(names, rows, strict=True):
        if not row:
            raise InvalidRequest(f"{name} must hold at least one token id", param="input")
        for j, token in enumerate(row):
            if not isinstance(token, int) or isinstance(token, bool):
                raise InvalidRequest(f"{name}[{j}] must be an integer token id, not {json.dumps(token)}",
                                     param="input")
            if token < 0 or (vocab is not None and token >= vocab):
                raise InvalidRequest(f"{name}[{j}]: token id {token} is not in the vocabulary"
                                     + (f" (0 to {vocab - 1})" if vocab is not None else ""), param="input")
    return rows


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    values: list[float] = vector.tolist()
    return values


@post(["/v1/embeddings", "/embeddings"], status_code=200, opt=ROUTE_OPT, summary="Create embeddings",
      tags=["openai"])
async def embeddings(request: Request[Any, Any, Any]) -> Response[Any]:
    try:
        body, unreadable = parse_json_object(await request.body()), None
    except InvalidRequest as exc:  # not JSON, nested too deeply...: said after the model check
        body, unreadable = {}, exc
    model = await model_for(request, body.get("model"))
    info = model.info
    if not model.capabilities.embeddings:  # before the body is checked, as mlx-bun: the route is the wrong one
        raise InvalidRequest(
            f'served model "{info.model_id}" is not an embedding model; serve an embedding model '
            f"(e.g. Qwen3-Embedding) to use /v1/embeddings")
    if unreadable is not None:
        raise unreadable
    check_fields(body, _RULES)
    tokenizer = model.tokenizer
    inputs = _inputs(body, info.config_int("vocab_size") or getattr(tokenizer, "vocab_size", None))
    if (context := info.context_window) is not None and isinstance(inputs[0], str):
        for text in inputs:  # each input must fit the context: refused before it is tokenized
            check_text_length(text, context)
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise InvalidRequest('encoding_format must be "float" or "base64"', param="encoding_format")
    dimensions = body.get("dimensions")
    width = hidden_size(info)
    if dimensions is not None and width is not None and dimensions > width:
        raise InvalidRequest(f"dimensions must be at most {width}", param="dimensions")
    instruction = body.get("instruction")
    end_id = end_token_id(info, tokenizer)
    if isinstance(inputs[0], str):
        ids = await off_loop(request, encode_inputs, tokenizer, [query_text(t, instruction) for t in inputs],
                             end_id, info.context_window)
    elif instruction is not None:
        raise InvalidRequest("instruction applies to text inputs only, not to token ids", param="instruction")
    else:
        ids = ended_inputs(inputs, end_id, info.context_window)
    vectors = await until_disconnect(request, model.call(lambda loaded: embed_ids(loaded, ids,
                                                                                   dimensions=dimensions)))
    tokens = sum(len(i) for i in ids)
    return Response(content={
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": _encode(v, fmt)} for i, v in enumerate(vectors)],
        "model": info.model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }, status_code=200)
