"""mlx_lm.server flag parity: CORS, chat templates."""

from __future__ import annotations

import json
import shutil


def test_cors_is_off_by_default_and_star_must_be_asked_for(mlxrt_tiny_checkpoint, mlxrt_serve):
    # mlx_lm.server answers every origin with *; mlxrt does so only when told (issue 22: any web
    # page could otherwise read a key-less server's answers).
    closed = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"host": "127.0.0.1"})
    assert "access-control-allow-origin" not in closed.get("/v1/models", headers={"origin": "http://x.test"}).headers
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"host": "127.0.0.1", "allowed_origins": "*"})
    resp = client.get("/v1/models", headers={"origin": "http://example.test"})
    assert resp.headers["access-control-allow-origin"] == "*"
    pre = client.options("/v1/chat/completions", headers={
        "origin": "http://example.test", "access-control-request-method": "POST"})
    assert pre.status_code in (200, 204) and "POST" in pre.headers["access-control-allow-methods"]


def test_cors_off_on_other_addresses_and_explicit_origins(mlxrt_tiny_checkpoint, mlxrt_serve):
    closed = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"host": "0.0.0.0"})
    assert "access-control-allow-origin" not in closed.get("/v1/models", headers={"origin": "http://x.test"}).headers
    listed = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"host": "0.0.0.0", "allowed_origins": "http://a.test"})
    headers = listed.get("/v1/models", headers={"origin": "http://a.test"}).headers
    assert headers["access-control-allow-origin"] == "http://a.test"


def test_use_default_chat_template(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    model = tmp_path / "no-template"
    shutil.copytree(mlxrt_tiny_checkpoint("llama"), model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    bare = mlxrt_serve(model)
    resp = bare.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and "no chat template" in resp.json()["error"]["message"]
    chatml = mlxrt_serve(model, options={"use_default_chat_template": True})
    assert chatml.post("/v1/chat/completions", json=body).status_code == 200


def test_chat_template_args_are_defaults_the_client_overrides(mlxrt_tiny_checkpoint, mlxrt_serve):
    template = "{{ marker }}{% for m in messages %}{{ m.content }}{% endfor %}"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    plain = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"chat_template": template})
    with_args = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"chat_template": template,
                                                         "chat_template_args": {"marker": "MARK " * 10}})
    base = plain.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    more = with_args.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    assert more >= base + 10
    body["chat_template_kwargs"] = {"marker": ""}
    assert with_args.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"] == base
