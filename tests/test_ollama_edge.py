"""The Ollama dialect's edges, in process: images (vision input, and a text model's refusal),
``raw`` prompts, API keys, strict model names, bad bodies (Ollama's ``{"error"}``, never a 500),
``keep_alive`` durations and the terminal's time display."""

from __future__ import annotations

import base64
import io
import json

import pytest

from mlxrt.errors import InvalidRequest
from mlxrt.plugins.ollama.wire import keep_alive_seconds, ollama_name, pool_name


def _png() -> str:
    from PIL import Image

    image = Image.new("RGB", (64, 48))
    image.putdata([(x * 4, y * 5, 128) for y in range(48) for x in range(64)])
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def qwen(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))


def _chat(client, content, **body):
    return client.post("/api/chat", json={"model": "m", "stream": False, "options": {"num_predict": 2},
                                          "messages": [{"role": "user", "content": content, **body.pop("msg", {})}],
                                          **body})


def test_images_are_vision_input(tmp_path, mlxrt_serve):
    from mlxrt.testing import write_tiny_checkpoint

    client = mlxrt_serve(write_tiny_checkpoint(tmp_path / "gemma4", "gemma4"))
    text = _chat(client, "describe the picture")
    image = _chat(client, "describe the picture", msg={"images": [_png()]})
    assert text.status_code == image.status_code == 200, image.text
    assert image.json()["prompt_eval_count"] - text.json()["prompt_eval_count"] > 60
    generated = client.post("/api/generate", json={"prompt": "describe", "images": [_png()], "stream": False,
                                                   "options": {"num_predict": 2}})
    assert generated.status_code == 200 and generated.json()["prompt_eval_count"] > 60
    broken = _chat(client, "describe", msg={"images": ["not base64 at all!"]})
    assert broken.status_code == 400 and set(broken.json()) == {"error"}


def test_a_text_model_refuses_images(qwen):
    out = _chat(qwen, "describe the picture", msg={"images": [_png()]})
    assert out.status_code == 400 and "no vision input" in out.json()["error"]


def test_raw_prompt_skips_the_template(qwen):
    templated = qwen.post("/api/generate", json={"prompt": "hello", "stream": False, "options": {"num_predict": 2}})
    raw = qwen.post("/api/generate", json={"prompt": "hello", "raw": True, "stream": False,
                                           "options": {"num_predict": 2}})
    assert raw.status_code == 200 and raw.json()["prompt_eval_count"] < templated.json()["prompt_eval_count"]
    assert raw.json()["eval_count"] == 2 and raw.json()["done_reason"] == "length"
    lines = [json.loads(line) for line in qwen.post("/api/generate", json={
        "prompt": "hello", "raw": True, "options": {"num_predict": 3}}).text.splitlines()]
    assert lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])
    assert lines[-1]["eval_count"] == 3 and lines[-1]["response"] == ""


def test_api_keys_guard_the_ollama_routes(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"api_keys": ["k1"]})
    refused = client.get("/api/tags")
    assert refused.status_code == 401 and set(refused.json()) == {"error"}
    assert client.get("/api/tags", headers={"Authorization": "Bearer k1"}).status_code == 200


def test_strict_names(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"strict_model": True, "model_fallback": False})
    missing = client.post("/api/show", json={"model": "llama3.2:latest"})
    assert missing.status_code == 404 and missing.json() == {"error": "model 'llama3.2:latest' not found"}
    chat = _chat(client, "hi", model="llama3.2")
    assert chat.status_code == 404 and set(chat.json()) == {"error"}
    assert _chat(client, "hi", model="qwen3-0-gen:latest").status_code == 200


@pytest.mark.parametrize("path,body,needle", [
    ("/api/chat", {"messages": "hi"}, "messages"),
    ("/api/chat", {"messages": [{"role": "user", "content": 3}]}, "content"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": "abc"}]}, "images"),
    ("/api/chat", {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]},
     "tool_calls"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]}, "tools"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "format": "yaml"}, "format"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "think": "max"}, "think"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "keep_alive": "soon"}, "keep_alive"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "options": {"top_p": 2}}, "options.top_p"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "options": {"stop": [1]}}, "options.stop"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "options": {"num_predict": True}},
     "options.num_predict"),
    ("/api/generate", {"prompt": "x", "raw": True, "images": ["abc"]}, "images"),
    ("/api/generate", {"prompt": 5}, "prompt"),
    ("/api/embed", {"input": []}, "input"),
    ("/api/pull", {"model": "smollm2:1b"}, "Hugging Face"),
    ("/api/show", {}, "model is required"),
    ("/api/chat", b"{not json", "JSON"),
])
def test_bad_bodies_are_ollama_errors(qwen, path, body, needle):
    out = qwen.post(path, content=body, headers={"content-type": "application/json"}) if isinstance(body, bytes) \
        else qwen.post(path, json=body)
    assert out.status_code == 400, out.text
    assert set(out.json()) == {"error"} and needle in out.json()["error"]
    assert qwen.get("/api/version").status_code == 200


def test_delete_an_unknown_model_is_404(qwen):
    out = qwen.request("DELETE", "/api/delete", json={"model": "nobody/nothing"})
    assert out.status_code == 404 and out.json() == {"error": "model 'nobody/nothing' not found"}
    resident = qwen.request("DELETE", "/api/delete", json={"model": "qwen3-0-gen:latest"})
    assert resident.status_code == 400 and "mlxrt stop" in resident.json()["error"]


def test_keep_alive_and_names():
    assert [keep_alive_seconds(v) for v in (None, 0, "0", 90, "5m", "1h30m", "250ms", "-1", -5, "1e999", 10**400)] \
        == [None, 0.0, 0.0, 90.0, 300.0, 5400.0, 0.25, -1.0, -5.0, -1.0, -1.0]
    for bad in ("soon", True, "nan", [], "5 m"):
        with pytest.raises(InvalidRequest):
            keep_alive_seconds(bad)
    assert ollama_name("org/name") == "org/name:latest" and ollama_name("smollm2:1b") == "smollm2:1b"
    assert pool_name("org/name:latest") == "org/name" and pool_name("smollm2:1b") == "smollm2:1b"
    assert pool_name("hf.co/org/name:latest") == "org/name" and pool_name("hf.co/x") == "hf.co/x"
    assert pool_name("") is None and pool_name(None) is None


def test_until_text():
    from mlxrt.cli.resident import until_text

    assert until_text("2318-11-26T00:00:00Z", now=0) == "Forever"
    assert until_text("1970-01-01T00:04:30Z", now=0) == "4 minutes from now"
    assert until_text("1970-01-01T00:00:00Z", now=10) == "Now"
