"""benchmarks/serving.py's request builder and stream reader: the side-by-side's text-completion
mode (``/v1/completions``, fixed length) beside the chat mode, on the stream shapes of mlxrt
(served in process), llama-server and mlx_lm.server (as their sources write them), and its
prompts sized as the tokenizer encodes them."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import httpx
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_serving", BENCHMARKS / "serving.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _sse(*chunks: dict | str) -> bytes:
    return "".join(c if isinstance(c, str) else f"data: {json.dumps(c)}\n\n" for c in chunks).encode()


def _read(bench, stream: bytes, prompt, max_tokens: int, extra: dict | None = None):
    """``stream_chat`` against a transport that answers ``stream``; (the reply, the request)."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await bench.stream_chat(client, "http://x", prompt, max_tokens, extra)

    reply = asyncio.run(run())
    return reply, seen[0]


def test_a_text_prompt_is_a_streaming_text_completion_with_the_extra_fields(bench):
    path, body = bench.request_body("Once upon a time", 8, {"ignore_eos": True})
    assert path == "/v1/completions"
    assert body == {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True}


def test_chat_messages_keep_the_chat_request(bench):
    messages = [{"role": "user", "content": "Hi"}]
    path, body = bench.request_body(messages, 4)
    assert path == "/v1/chat/completions"
    assert body == {"messages": messages, "max_tokens": 4, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}


def test_fixed_length_fields_give_mlx_lm_server_a_bias_on_every_eos_id(bench):
    assert bench.fixed_length_fields("mlxrt", {1, 106}) == {"ignore_eos": True}
    assert bench.fixed_length_fields("llama-server", {1, 106}) == {"ignore_eos": True}
    # mlx_lm.server drops fields it does not know (ignore_eos); logit_bias it applies
    assert bench.fixed_length_fields("mlx_lm.server", {106, 1}) == {"logit_bias": {"1": -1e9, "106": -1e9}}


def test_llama_server_text_stream_takes_its_usage_from_the_last_chunk(bench):
    # llama-server's /v1/completions stream: each chunk a choice with ``text``; the final one has
    # an empty text, the finish reason and ``usage`` whether or not include_usage was asked for
    final = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "object": "text_completion",
             "usage": {"completion_tokens": 5, "prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": 2}}}
    stream = _sse(*({"choices": [{"text": t, "index": 0, "finish_reason": None}]} for t in ["a", " b", " c"]),
                  final, "data: [DONE]\n\n")
    reply, request = _read(bench, stream, "Ticket 1.", 5, {"ignore_eos": True})
    assert request.url.path == "/v1/completions"
    assert json.loads(request.content)["ignore_eos"] is True
    assert (reply.text, reply.chunks, reply.tokens, reply.prompt_tokens, reply.cached_tokens) == ("a b c", 3, 5, 7, 2)
    assert reply.t0 <= reply.first <= reply.last <= reply.end


def test_mlx_lm_server_text_stream_with_keepalives_and_a_usage_chunk(bench):
    # mlx_lm.server: ": keepalive" comments while it reads the prompt, text chunks, a finishing
    # chunk, then (include_usage) a chunk without choices that carries the usage
    stream = _sse(": keepalive 3/7\n\n", {"choices": [{"index": 0, "finish_reason": None, "text": "x"}]},
                  {"choices": [{"index": 0, "finish_reason": None, "text": "yz"}]},
                  {"choices": [{"index": 0, "finish_reason": "length", "text": ""}]},
                  {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}},
                  "data: [DONE]\n\n")
    reply, _request = _read(bench, stream, "p", 4, {"logit_bias": {"1": -1e9}})
    assert (reply.text, reply.chunks, reply.tokens, reply.prompt_tokens, reply.cached_tokens) == ("xyz", 2, 4, 7, None)


def test_a_stream_without_usage_counts_its_content_chunks(bench):
    stream = _sse(*({"choices": [{"text": t}]} for t in ["a", "", "b", "c"]), "data: [DONE]\n\n")
    reply, _request = _read(bench, stream, "p", 8)
    assert (reply.text, reply.tokens) == ("abc", 3)


def test_chat_stream_is_read_from_the_deltas(bench):
    stream = _sse({"choices": [{"delta": {"role": "assistant"}, "index": 0}]},
                  {"choices": [{"delta": {"content": "Hel"}, "index": 0}]},
                  {"choices": [{"delta": {"content": "lo"}, "index": 0}]},
                  {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}, "data: [DONE]\n\n")
    reply, request = _read(bench, stream, [{"role": "user", "content": "Hi"}], 2)
    assert request.url.path == "/v1/chat/completions"
    assert "ignore_eos" not in json.loads(request.content)
    assert (reply.text, reply.chunks, reply.tokens, reply.prompt_tokens) == ("Hello", 2, 2, 9)


def test_mlxrt_serves_the_fixed_length_text_request_to_max_tokens(bench, mlxrt_client):
    # mlxrt's own stream for the request the harness builds: read back, usage counts every token
    path, body = bench.request_body("Ticket 00001. The harbour master counted", 12,
                                    bench.fixed_length_fields("mlxrt", ()))
    answer = mlxrt_client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    reply, _request = _read(bench, answer.content, "unused", 12)
    assert reply.tokens == 12 and reply.prompt_tokens > 0


def test_text_prompts_are_sized_as_the_tokenizer_encodes_them(bench, mlxrt_tiny_checkpoint, tmp_path):
    folder = tmp_path / "base"
    shutil.copytree(mlxrt_tiny_checkpoint("llama"), folder)
    assert bench.Prompts(str(folder), text=None).text is False  # it has a chat template: chat
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    # Gemma 3's way: generation_config.json adds an end of turn to the tokenizer's end of sequence
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    prompts = bench.Prompts(str(folder), text=None)
    assert prompts.text is True  # a base model's checkpoint: text completions
    assert {1, 7} | prompts.tok.eos_token_ids <= prompts.eos_ids
    short = prompts.short(12, 32)
    assert isinstance(short, str) and short.startswith("Ticket 00012. ")
    assert prompts.count(short) >= 32 and prompts.count(short.rsplit(" ", 1)[0]) < 32
    long = prompts.long(3, 200)
    assert isinstance(long, str) and long.endswith("\nAnswer:") and 190 <= prompts.count(long) <= 230
    assert isinstance(prompts.story(5), str)
