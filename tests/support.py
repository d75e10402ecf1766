"""Helpers shared by tests: SDK clients over the in-process app, real server processes."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from mlxrt import hookimpl

#: The installed console script, beside the running interpreter.
MLXRT_BIN = str(Path(sys.executable).with_name("mlxrt"))


def primitive_counts(*outputs: Any) -> Counter:
    """The MLX primitives of the graph that computes ``outputs``, counted by name
    (``mx.export_to_dot``'s node labels)."""
    import mlx.core as mx

    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return Counter(re.findall(r'label ="([A-Za-z_]+)', dot.getvalue()))


def tiny_mlx_lm_model(model_type: str, *, vocab_size: int, seed: int, quantized: bool = False,
                      sliding_window: int = 4) -> Any:
    """A two-layer mlx-lm model of ``model_type`` (llama, qwen2, qwen3, gemma3_text) with random
    weights, built in memory; Gemma 3's first layer slides over a ``sliding_window``-token window
    (a rotating cache), its second is global. ``quantized``: its linear layers at 4 bits, group 32."""
    import importlib

    import mlx.core as mx
    import mlx.nn as nn

    arch = importlib.import_module(f"mlx_lm.models.{model_type}")
    args = {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": vocab_size}
    if model_type == "qwen3":
        args.update(head_dim=16, max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=True)
    if model_type == "gemma3_text":
        args.update(head_dim=16, sliding_window=sliding_window, sliding_window_pattern=2, query_pre_attn_scalar=16)
    mx.random.seed(seed)
    model = arch.Model(arch.ModelArgs(**args))
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def tiny_quantized_llama(bits: int, embedding_bits: int, *, seed: int) -> Any:
    """A two-block mlx-lm llama (hidden 128, vocabulary 512, tied head) with random weights, its
    linear layers quantized at ``bits`` and its embedding (so the tied head) at ``embedding_bits``,
    group 32: the layout of a GGUF's Q4_1 or Q8_0 blocks with a Q8_0 embedding."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=512,
                           tie_word_embeddings=True)
    mx.random.seed(seed)
    model = llama.Model(args)
    nn.quantize(model, group_size=32, bits=bits)
    model.model.embed_tokens = nn.QuantizedEmbedding.from_embedding(nn.Embedding(512, 128), group_size=32,
                                                                    bits=embedding_bits)
    mx.eval(model.parameters())
    return model


def greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt``, a decode step at a time through mlx-lm's prompt cache."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    tokens, out = mx.array([prompt]), []
    for _ in range(n):
        nxt = int(mx.argmax(model(tokens, cache=cache)[:, -1, :], axis=-1).item())
        out.append(nxt)
        tokens = mx.array([[nxt]])
    return out


def openai_client(http_client):
    import openai

    return openai.OpenAI(base_url=f"{http_client.base_url}/v1", api_key="unused", http_client=http_client,
                         max_retries=0)


def anthropic_client(http_client):
    """The official anthropic client over the in-process app.

    Recent anthropic SDKs speak ``httpx2`` and refuse httpx objects such as Litestar's
    TestClient; for those a mock transport forwards each request through the TestClient (a
    stream arrives whole, which its SSE parser reads like any other)."""
    import anthropic

    try:
        return anthropic.Anthropic(base_url=str(http_client.base_url), api_key="unused", max_retries=0,
                                   http_client=http_client)
    except TypeError:
        import httpx2

    def forward(request):
        resp = http_client.request(request.method, str(request.url), headers=list(request.headers.multi_items()),
                                   content=request.read())
        return httpx2.Response(resp.status_code, headers=list(resp.headers.multi_items()), content=resp.content)

    return anthropic.Anthropic(base_url=str(http_client.base_url), api_key="unused", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(forward)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A real ``mlxrt serve`` on 127.0.0.1, stopped at teardown."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, timeout: float = 120):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            # placeholder model names ("m") are answered by the served model (the default on loopback;
            # --model-fallback keeps it so should a test make the server strict).
            [MLXRT_BIN, "serve", *args, "--port", str(self.port), "--model-fallback"],
            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd="/",
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlxrt serve exited {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"mlxrt serve did not become healthy in {timeout}s")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stdout.read() if self.proc.stdout else ""




class Scripted:
    """Claims the ``script`` field (on every dialect); samples its tokens, then EOS."""

    @hookimpl
    def mlxrt_request_fields(self, dialect):
        return {"script": str}

    @hookimpl
    def mlxrt_sampler(self, request, info):
        script = request.extra.get("script")
        if script is None:
            return None
        import mlx.core as mx

        tok = Tokenizer.from_file(str(info.path / "tokenizer.json"))
        eos = json.loads((info.path / "generation_config.json").read_text())["eos_token_id"]
        ids = iter(tok.encode(script, add_special_tokens=False).ids + [eos if isinstance(eos, int) else eos[0]])

        def sample(logprobs):
            return mx.array([next(ids, 0)])

        return sample


class Exploding:
    """Claims ``explode``: a logits processor that raises on its ``explode``-th call (a plugin bug
    mid-decode, for the tests that it fails only its own request)."""

    @hookimpl
    def mlxrt_request_fields(self, dialect):
        return {"explode": int}

    @hookimpl
    def mlxrt_logits_processors(self, request, info, host):
        if "explode" not in request.extra:
            return []
        calls = []

        def processor(tokens, logits):
            calls.append(1)
            if len(calls) >= request.extra["explode"]:
                raise RuntimeError(f"processor exploded for {request.extra['explode']}")
            return logits

        return [processor]
