"""Issue 31, the edge: what one API key leaves in the server is invisible to another (the prompt
cache, in memory and on disk), and every route bounds its work before it spends it (text length,
body read time, image pixels across requests, template rendering time, config sizes), so the
server keeps answering ``/health`` and new clients while one client misbehaves."""

from __future__ import annotations

import openai
import pytest

SYSTEM = ("Confidential board memo. The merger with Zebrafalcon Corp closes on March 3rd at a price "
          "of 412 million; nobody outside the board may learn the price or the date. " * 3)


def _client(http, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key=key, http_client=http, max_retries=0)


def _ask(client: openai.OpenAI, system: str, question: str = "When?"):
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=2, temperature=0)
    done = raw.parse()
    return done.usage.prompt_tokens_details.cached_tokens, raw.headers["x-mlxrt-cache"], done


# -- finding 1: the prompt cache is partitioned by caller --------------------------------------


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "disk"])
def test_one_key_never_reuses_or_sees_another_keys_prompt(tiny_models, serve_app, tmp_path, on_disk):
    guessers = ["key-two", "key-three", "key-four"]
    options = {"api_keys": ["key-one", *guessers, "key-five"]}
    if on_disk:
        options["prompt_cache_dir"] = str(tmp_path / "pc")
    server = serve_app(tiny_models("qwen3"), options=options)
    one = _client(server, "key-one")
    _ask(one, SYSTEM)
    cached, _header, _ = _ask(one, SYSTEM, "Where?")
    assert cached > 40  # the cache works for its owner...
    wrong = SYSTEM.replace("412", "413")
    # ...and tells another key nothing (each guess from a fresh key, whose own cache is empty):
    # no reuse, and a header that does not say how far the guess matched.
    for key, guess in zip(guessers, (SYSTEM, wrong, SYSTEM.replace("Zebrafalcon", "Quokka")), strict=True):
        cached, header, _ = _ask(_client(server, key), guess)
        assert cached == 0, key
        assert header.startswith("miss") and "diverged" not in header and "no cached prompt" in header, header
    # A guesser's own repeat is cached, for that key.
    assert _ask(_client(server, "key-three"), wrong)[0] > 40
    if on_disk:
        # After a restart the files keep their partition: key two still gets nothing of key one's.
        server.app.state.host.models.stop()
        again = serve_app(tiny_models("qwen3"), options=options)
        assert _ask(_client(again, "key-five"), SYSTEM, "Where?")[0] == 0
        assert _ask(_client(again, "key-one"), SYSTEM, "Why?")[0] > 40


def test_without_keys_every_client_shares_one_partition(tiny_models, serve_app):
    server = serve_app(tiny_models("qwen3"))
    _ask(_client(server, "a"), SYSTEM)
    assert _ask(_client(server, "b"), SYSTEM, "Where?")[0] > 40  # any bearer text: the same caller


# -- finding 2: count_tokens and embeddings refuse over-long text before tokenizing ------------


def test_count_tokens_refuses_over_long_text_before_templating(tiny_models, serve_app, monkeypatch):
    import time

    import mlxrt.plugins.anthropic.routes as anthropic_routes

    server = serve_app(tiny_models("qwen3"))
    ceiling = server.get("/stats").json()["engine"]["admission"]["context_ceiling"]

    def never(*_args, **_kwargs):
        raise AssertionError("the over-long prompt was templated")

    monkeypatch.setattr(anthropic_routes, "render_chat", never)
    body = {"model": "m", "messages": [{"role": "user", "content": "a " * (ceiling * 16 + 8)}]}
    started = time.monotonic()
    resp = server.post("/v1/messages/count_tokens", json=body)
    assert time.monotonic() - started < 5
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and "shorten the prompt" in error["message"]
    assert f"context holds {ceiling}" in error["message"]
    monkeypatch.undo()
    short = server.post("/v1/messages/count_tokens", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert short.status_code == 200 and short.json()["input_tokens"] > 0
    assert server.get("/health").status_code == 200


def test_embeddings_refuse_over_long_inputs_before_tokenizing(tiny_models, serve_app, monkeypatch):
    import time

    import mlxrt.plugins.openai.embeddings as embeddings

    server = serve_app(tiny_models("qwen3_embedding"))
    context = server.get("/stats").json()["engine"]["admission"]["context_ceiling"]  # the window, no budget

    def never(*_args, **_kwargs):
        raise AssertionError("the over-long input was tokenized")

    monkeypatch.setattr(embeddings, "encode_inputs", never)
    for payload in ("a " * (context * 16 + 8), ["short", "a " * (context * 16 + 8)]):
        started = time.monotonic()
        resp = server.post("/v1/embeddings", json={"model": "m", "input": payload})
        assert time.monotonic() - started < 5
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "context_over_budget" and "shorten the prompt" in error["message"]
    monkeypatch.undo()
    ok = server.post("/v1/embeddings", json={"model": "m", "input": ["short", "texts"]})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 2


# -- finding 10 (second half): deep nesting in an ignored field of /v1/embeddings ---------------


@pytest.mark.parametrize("model", ["qwen3_embedding", "qwen3"])
def test_deeply_nested_ignored_field_of_embeddings_is_a_400(tiny_models, serve_app, model):
    server = serve_app(tiny_models(model))
    deep = b'{"model": "m", "input": "hi", "extra": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    resp = server.post("/v1/embeddings", content=deep, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "error" in resp.json()
    assert server.get("/health").status_code == 200

