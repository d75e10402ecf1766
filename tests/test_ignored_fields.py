"""Fields mlxrt does not read are reported, never silently dropped; --strict refuses them."""

from __future__ import annotations

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "model": "x", "user": "u"}


def test_unread_fields_are_listed_in_a_header(mlxrt_client):
    resp = mlxrt_client.post("/v1/chat/completions", json={**BODY, "frobnicate": 1, "metadata": {}})
    assert resp.status_code == 200
    assert resp.headers["x-mlxrt-ignored"] == "frobnicate, metadata"
    clean = mlxrt_client.post("/v1/chat/completions", json=BODY)
    assert "x-mlxrt-ignored" not in clean.headers
    stream = mlxrt_client.post("/v1/chat/completions", json={**BODY, "stream": True, "frobnicate": 1})
    assert stream.headers["x-mlxrt-ignored"] == "frobnicate"
    text = mlxrt_client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "frobnicate": 1})
    assert text.headers["x-mlxrt-ignored"] == "frobnicate"


def test_strict_refuses_unread_fields(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"strict": True})
    resp = client.post("/v1/chat/completions", json={**BODY, "frobnicate": 1})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["message"].startswith("unknown field: frobnicate") and error["code"] == "unknown_parameter"
    assert client.post("/v1/chat/completions", json=BODY).status_code == 200
