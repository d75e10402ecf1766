"""The ``plain`` dialect's wire: decode a body into a turn, encode the answer."""

from __future__ import annotations

from litestar import Request, Response, post

from mlxrt.api.pipeline import Answer, ChatInput, Framed, Turn, route_opt, serve_chat, sse_data
from mlxrt.errors import InvalidRequest
from mlxrt.records import RequestOptions


class Frames:
    """``data: {"text": ...}`` per delta, then ``data: {"stop_reason": ..., "tokens": n}``."""

    def __init__(self, id, model):
        self.id, self.model = id, model

    def start(self):
        return [sse_data({"id": self.id, "model": self.model})]

    def feed(self, *, reasoning="", text=""):
        return [sse_data({"text": text})] if text else []

    def finish(self, calls, reason, finish):
        return [sse_data({"stop_reason": str(reason), "tokens": finish.completion_tokens})]


class Plain(Framed):
    name = "plain"
    default_max_tokens = 16

    def decode(self, body, claimed, *, strict):
        text = body.get("text")
        if not isinstance(text, str) or not text:
            raise InvalidRequest("text must be a non-empty string", param="text")
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise InvalidRequest("max_tokens must be a positive integer", param="max_tokens")
        options = RequestOptions(sampling={"temperature": body.get("temperature")}, max_tokens=max_tokens,
                                 seed=body.get("seed"), stop=tuple(body.get("stop") or ()),
                                 extra={k: body[k] for k in claimed if k in body})
        chat = ChatInput(messages=({"role": "user", "content": text},))
        return Turn(chat=chat, options=options, model=body.get("model"), stream=bool(body.get("stream")))

    def new_id(self):
        import uuid

        return f"plain-{uuid.uuid4().hex}"

    def body(self, answer: Answer):
        return {"id": answer.id, "model": answer.model, "text": answer.content, "stop_reason": str(answer.reason),
                "tokens": answer.finish.completion_tokens}

    def frames(self, *, id, model, report, turn):
        return Frames(id, model)

    def render_error(self, status, type_, message, param, code):
        return {"problem": {"status": status, "message": message, "field": param}}

    def error_frame(self, exc):
        return sse_data(self.render_error(exc.status, exc.type, exc.message, exc.param, exc.code))


PLAIN = Plain()


@post("/v1/plain", status_code=200, opt=route_opt(PLAIN))
async def plain(request: Request) -> Response:
    return await serve_chat(request, PLAIN)


ROUTES = [plain]
