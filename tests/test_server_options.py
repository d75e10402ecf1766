"""mlx_lm.server flag parity: CORS, chat templates."""

from __future__ import annotations

import json
import shutil


def test_cors_is_off_by_default_and_star_must_be_asked_for(tiny_models, serve_app):
    # mlx_lm.server answers every origin with *; mlxrt does so only when told (issue 22: any web
    # page could otherwise read a key-less server's answers).
    closed = serve_app(tiny_models("llama"), options={"host": "127.0.0.1"})
    assert "access-control-allow-origin" not in closed.get("/v1/models", headers={"origin": "http://x.test"}).headers
    client = serve_app(tiny_models("llama"), options={"host": "127.0.0.1", "allowed_origins": "*"})
    resp = client.get("/v1/models", headers={"origin": "http://example.test"})
    assert resp.headers["access-control-allow-origin"] == "*"
    pre = client.options("/v1/chat/completions", headers={
        "origin": "http://example.test", "access-control-request-method": "POST"})
    assert pre.status_code in (200, 204) and "POST" in pre.headers["access-control-allow-methods"]


def test_cors_off_on_other_addresses_and_explicit_origins(tiny_models, serve_app):
    closed = serve_app(tiny_models("llama"), options={"host": "0.0.0.0"})
    assert "access-control-allow-origin" not in closed.get("/v1/models", headers={"origin": "http://x.test"}).headers
    listed = serve_app(tiny_models("llama"), options={"host": "0.0.0.0", "allowed_origins": "http://a.test"})
    headers = listed.get("/v1/models", headers={"origin": "http://a.test"}).headers
    assert headers["access-control-allow-origin"] == "http://a.test"


def test_use_default_chat_template(tiny_models, serve_app, tmp_path):
    model = tmp_path / "no-template"
    shutil.copytree(tiny_models("llama"), model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    bare = serve_app(model)
    resp = bare.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and "no chat template" in resp.json()["error"]["message"]
    chatml = serve_app(model, options={"use_default_chat_template": True})
    assert chatml.post("/v1/chat/completions", json=body).status_code == 200


def test_chat_template_args_are_defaults_the_client_overrides(tiny_models, serve_app):
    template = "{{ marker }}{% for m in messages %}{{ m.content }}{% endfor %}"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    plain = serve_app(tiny_models("llama"), options={"chat_template": template})
    with_args = serve_app(tiny_models("llama"), options={"chat_template": template,
                                                         "chat_template_args": {"marker": "MARK " * 10}})
    base = plain.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    more = with_args.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    assert more >= base + 10
    body["chat_template_kwargs"] = {"marker": ""}
    assert with_args.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"] == base
