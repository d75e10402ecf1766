"""llama-server's helper endpoints beside OpenAI's, which its clients and test suite call
(docs/dialects.md, "llama.cpp and vLLM fields"):

- ``POST /tokenize`` ``{"content", "add_special", "with_pieces"}`` → ``{"tokens": [...]}`` (a piece
  is the token's text, or its bytes as integers where they are not whole UTF-8);
- ``POST /detokenize`` ``{"tokens": [...]}`` → ``{"content": "..."}``;
- ``POST /apply-template``: a chat-completions body → ``{"prompt": "..."}``, the prompt its
  chat template renders (what ``verbose: true`` returns in ``__verbose.prompt``);
- ``POST /v1/chat/completions/input_tokens``: a chat-completions body → ``{"input_tokens": N}``,
  the prompt tokens it would run with (as Anthropic's ``count_tokens``).

Each takes an optional ``model`` (the served model by default), refuses text or ids longer
than that model's context could hold before any work (chat's length guard,
:mod:`mlxrt.api.text_limits`: a 16 MB ``/tokenize`` held the interpreter's lock for a minute),
tokenizes and renders off the event loop, and answers errors as OpenAI error objects.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, post

from mlxrt.api.app import claimed_fields
from mlxrt.api.disconnect import off_loop
from mlxrt.api.models import model_for
from mlxrt.api.openapi import BODIES, with_rules
from mlxrt.api.text_limits import refuse_overlong_ids, refuse_overlong_text
from mlxrt.api.wire import FieldRule, check_fields, parse_json_object
from mlxrt.errors import InvalidRequest
from mlxrt.plugins.openai.decode import decode_chat
from mlxrt.plugins.openai.encode import ROUTE_OPT
from mlxrt.plugins.openai.wire import CHAT_RULES
from mlxrt.records import ChatInput
from mlxrt.serving import ServedModel
from mlxrt.templating import RenderedPrompt

__all__ = ["LLAMA_ROUTES", "rendered_prompt"]

_TOKENIZE_RULES = (FieldRule("content", (str,), nullable=False), FieldRule("add_special", (bool,)),
                   FieldRule("with_pieces", (bool,)), FieldRule("model", (str,)))
_DETOKENIZE_RULES = (FieldRule("tokens", (list,), nullable=False), FieldRule("model", (str,)))
#: The bodies the OpenAPI schema declares (mlxrt.api.openapi), so schema-driven clients reach them.
_TOKENIZE_OPT = {**ROUTE_OPT, "body_schema": with_rules({"type": "object", "required": ["content"], "properties": {
    "content": {"type": "string"}}}, _TOKENIZE_RULES)}
_DETOKENIZE_OPT = {**ROUTE_OPT, "body_schema": with_rules({"type": "object", "required": ["tokens"], "properties": {
    "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}, _DETOKENIZE_RULES)}
_CHAT_BODY_OPT = {**ROUTE_OPT, "body_schema": BODIES["/v1/chat/completions"], "field_rules": CHAT_RULES}


def rendered_prompt(model: ServedModel, chat: ChatInput) -> RenderedPrompt:
    """``chat`` as ``model``'s chat template renders and tokenizes it (call off the loop)."""
    return model.render(chat)


async def _decoded_chat(request: Request[Any, Any, Any]) -> tuple[ServedModel, Any]:
    host = request.app.state.host
    body = parse_json_object(await request.body())
    decoded = decode_chat(body, claimed_fields(host, "openai"), strict=bool(host.options.get("strict")))
    model = await model_for(request, decoded.request.model)
    await refuse_overlong_text(request, body, model)
    return model, decoded


async def _helper_body(request: Request[Any, Any, Any], field: str, what: str, rules: tuple[FieldRule, ...]
                       ) -> tuple[Any, ServedModel]:
    """A helper endpoint's checked body (``field`` required, its text and ids within what the
    model's context could hold) and the model its ``model`` names."""
    body = parse_json_object(await request.body())
    if field not in body:
        raise InvalidRequest(f"{field} ({what}) is required", param=field)
    check_fields(body, rules)
    model = await model_for(request, body.get("model"))
    await refuse_overlong_text(request, body, model)
    if isinstance(body.get("tokens"), list):
        refuse_overlong_ids(len(body["tokens"]), model)
    return body, model


@post("/tokenize", status_code=200, opt=_TOKENIZE_OPT, summary="Tokenize text (llama-server)", tags=["llama.cpp"])
async def tokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body, model = await _helper_body(request, "content", "the text to tokenize", _TOKENIZE_RULES)

    def run() -> dict[str, Any]:
        tokenizer = model.tokenizer
        ids = list(tokenizer.encode(body["content"], add_special_tokens=bool(body.get("add_special"))))
        if not body.get("with_pieces"):
            return {"tokens": ids}
        from mlxrt.text.token_bytes import token_bytes

        table = token_bytes(tokenizer)  # the bytes each token adds (a reason string where unreadable)

        def piece(token: int) -> str | list[int]:
            # llama-server's shape: a token's text, or its bytes where they are not whole UTF-8
            # (one byte of a character spelled <0xNN>, half of a byte-level BPE character)
            data = table.piece(token, first=False) if not isinstance(table, str) else tokenizer.decode([token]).encode()
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                return list(data)

        return {"tokens": [{"id": i, "piece": piece(i)} for i in ids]}

    return await off_loop(request, run)


@post("/detokenize", status_code=200, opt=_DETOKENIZE_OPT, summary="Detokenize ids (llama-server)", tags=["llama.cpp"])
async def detokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body, model = await _helper_body(request, "tokens", "the ids to detokenize", _DETOKENIZE_RULES)
    vocab = model.info.config_int("vocab_size")
    for i, token in enumerate(body["tokens"]):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (vocab is not None and token >= vocab):
            raise InvalidRequest(f"tokens[{i}] must be a token id (an integer from 0 to {vocab - 1 if vocab else '…'})",
                                 param="tokens")
    return {"content": await off_loop(request, model.tokenizer.decode, list(body["tokens"]))}


@post("/apply-template", status_code=200, opt=_CHAT_BODY_OPT, summary="Render a chat's prompt (llama-server)",
      tags=["llama.cpp"])
async def apply_template(request: Request[Any, Any, Any]) -> dict[str, str]:
    model, decoded = await _decoded_chat(request)
    rendered = await off_loop(request, rendered_prompt, model, decoded.chat)
    return {"prompt": rendered.text}


@post(["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"], status_code=200, opt=_CHAT_BODY_OPT,
      summary="Count a chat's input tokens", tags=["openai"])
async def input_tokens(request: Request[Any, Any, Any]) -> dict[str, int]:
    model, decoded = await _decoded_chat(request)
    return {"input_tokens": await off_loop(request, lambda: model.count_tokens(decoded.chat, dialect="openai"))}


LLAMA_ROUTES = [tokenize, detokenize, apply_template, input_tokens]
