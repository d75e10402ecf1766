"""A client's own model name (issue 30): on a server that is not strict, a ``model`` that names no
local model is answered by the served model, and the substitution is reported — the response's
``model`` is the served model's id, the ``x-mlxrt-model-fallback`` header names what was asked
for, and the log says it once per name. Strict servers answer 404. A name that cannot be a path
(too long, a NUL byte) never reaches a filesystem error. Every dialect, through the official
``openai`` and ``anthropic`` clients; several-model behaviour is tests/test_multi_model.py's.
"""

from __future__ import annotations

import logging

import anthropic
import openai
import pytest
from support import anthropic_client, openai_client

HI = [{"role": "user", "content": "hi"}]
HEADER = "x-mlxrt-model-fallback"
LOOSE = {"model_fallback": False, "strict_model": False}  # the loopback default: not strict, no flag
STRICT = {"model_fallback": False, "strict_model": True}
LONG = "m" * 300  # over any filesystem's 255-byte name limit
TOO_LONG_PATH = "org/" + "x" * 300


@pytest.fixture
def loose(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options=LOOSE)


@pytest.fixture
def strict(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options=STRICT)


def served_id(client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def answered(client, dialect: str, model: str) -> tuple[str, str | None]:
    """(the response's ``model``, the fallback header) of one request in ``dialect``."""
    oa, an = openai_client(client), anthropic_client(client)
    if dialect == "chat":
        raw = oa.chat.completions.with_raw_response.create(model=model, messages=HI, max_tokens=3)
    elif dialect == "chat-stream":
        with oa.chat.completions.with_streaming_response.create(model=model, messages=HI, max_tokens=3,
                                                                stream=True) as raw:
            chunks = list(raw.parse())
            return chunks[0].model, raw.headers.get(HEADER)
    elif dialect == "completions":
        raw = oa.completions.with_raw_response.create(model=model, prompt="a b", max_tokens=3)
    elif dialect == "responses":
        raw = oa.responses.with_raw_response.create(model=model, input="hi", max_output_tokens=3)
    elif dialect == "messages":
        raw = an.messages.with_raw_response.create(model=model, messages=HI, max_tokens=3)
    elif dialect == "count_tokens":
        raw = an.messages.with_raw_response.count_tokens(model=model, messages=HI)
        return model, raw.headers.get(HEADER)  # a count names no model
    else:
        raise AssertionError(dialect)
    return raw.parse().model, raw.headers.get(HEADER)


DIALECTS = ["chat", "chat-stream", "completions", "responses", "messages", "count_tokens"]
CLIENT_NAMES = {"chat": "gpt-4o", "chat-stream": "gpt-4o-mini", "completions": "gpt-3.5-turbo-instruct",
                "responses": "gpt-4.1", "messages": "claude-opus-4-5", "count_tokens": "claude-haiku-4-5"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_clients_own_model_name_is_answered_by_the_served_model_and_reported(loose, dialect):
    served = served_id(loose)
    model, header = answered(loose, dialect, CLIENT_NAMES[dialect])
    assert header == CLIENT_NAMES[dialect]
    if dialect != "count_tokens":
        assert model == served
    # a name the server serves is no fallback: no header
    assert answered(loose, dialect, served) == (served, None)
    assert answered(loose, dialect, "default") == (served if dialect != "count_tokens" else "default", None)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", [LONG, TOO_LONG_PATH, "bad\x00name", "../" * 100 + "nope"])
def test_names_that_cannot_be_paths_fall_back_and_never_500(loose, dialect, name):
    model, header = answered(loose, dialect, name)
    expected = name if len(name) <= 200 else name[:200] + "..."
    assert header == expected.encode("unicode_escape").decode("ascii")
    if dialect != "count_tokens":
        assert model == served_id(loose)


@pytest.mark.parametrize("name", ["gpt-4o", LONG, TOO_LONG_PATH, "bad\x00name"])
def test_a_strict_server_answers_unknown_names_404_in_each_dialect(strict, name):
    oa, an = openai_client(strict), anthropic_client(strict)
    with pytest.raises(openai.NotFoundError) as caught:
        oa.chat.completions.create(model=name, messages=HI, max_tokens=3)
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oa.completions.create(model=name, prompt="a", max_tokens=3)
    with pytest.raises(openai.NotFoundError):
        oa.responses.create(model=name, input="hi", max_output_tokens=3)
    with pytest.raises(anthropic.NotFoundError) as caught:
        an.messages.create(model=name, messages=HI, max_tokens=3)
    assert caught.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        an.messages.count_tokens(model=name, messages=HI)
    assert oa.chat.completions.create(model=served_id(strict), messages=HI, max_tokens=3).model == served_id(strict)


def test_each_substituted_name_is_logged_once(loose, caplog):
    served = served_id(loose)
    with caplog.at_level(logging.INFO, logger="mlxrt.models"):
        for name in ("gpt-4o", "gpt-4o", "claude-opus-4-5", "gpt-4o"):
            openai_client(loose).chat.completions.create(model=name, messages=HI, max_tokens=2)
    lines = [r.getMessage() for r in caplog.records if "is not served here" in r.getMessage()]
    assert lines == [f"model 'gpt-4o' is not served here: the served model {served} answers it (header {HEADER})",
                     f"model 'claude-opus-4-5' is not served here: the served model {served} answers it "
                     f"(header {HEADER})"]


def test_a_local_model_named_by_a_request_still_loads(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={**LOOSE, "max_models": 2})
    other = mlxrt_tiny_checkpoint("qwen3")
    raw = openai_client(client).chat.completions.with_raw_response.create(model=str(other), messages=HI,
                                                                          max_tokens=3)
    assert raw.parse().model == other.name and raw.headers.get(HEADER) is None


def test_embeddings_fall_back_to_the_served_embedding_model(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3_embedding"), options=LOOSE)
    raw = openai_client(client).embeddings.with_raw_response.create(model="text-embedding-3-small", input="hi")
    out = raw.parse()
    assert out.model == served_id(client) and raw.headers.get(HEADER) == "text-embedding-3-small"
    assert len(out.data) == 1 and len(out.data[0].embedding) > 0
    strict = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3_embedding"), options=STRICT)
    with pytest.raises(openai.NotFoundError):
        openai_client(strict).embeddings.create(model="text-embedding-3-small", input="hi")


def test_stats_say_whether_unknown_names_fall_back(mlxrt_tiny_checkpoint, mlxrt_serve):
    assert mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options=LOOSE).get("/stats").json()["models"]["fallback"] is True
    assert mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options=STRICT).get("/stats").json()["models"]["fallback"] is False
