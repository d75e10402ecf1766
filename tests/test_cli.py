"""The `mlxrt` command line through a subprocess, and a real server on 127.0.0.1."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
from support import MLXRT_BIN, openai_client

import mlxrt


def run(*args, **kw):
    return subprocess.run([MLXRT_BIN, *args], capture_output=True, text=True, cwd="/", **kw)


def test_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith(f"mlxrt {mlxrt.__version__}, mlx ")


def test_serve_help_shows_mlx_lm_flags_and_the_fallback_chain():
    out = run("serve", "--help").stdout
    for flag in ("--model", "--host", "--port", "--temp", "--top-p", "--top-k", "--min-p", "--max-tokens",
                 "--adapter-path", "--kv-bits", "--disable-plugin", "--chat-template-args"):
        assert flag in out
    assert "generation_config.json" in out and "127.0.0.1" in out and "8080" in out


def test_engine_defaults_are_stated_once_and_agree_everywhere():
    """`mlxrt serve` with no flags, an in-process server's options without them, EngineConfig's own
    fields, `mlxrt serve --help` and docs/operators.md all give the same engine defaults."""
    from mlxrt.cli import build_cli
    from mlxrt.engine.config import ENGINE_DEFAULTS, EngineConfig
    from mlxrt.host import make_host

    serve = build_cli(make_host()).commands["serve"]
    with serve.make_context("serve", []) as ctx:  # parsed as a bare `mlxrt serve` would be
        parsed = dict(ctx.params)
    assert {name: parsed[name] for name in ENGINE_DEFAULTS} == dict(ENGINE_DEFAULTS)
    assert EngineConfig.from_options(parsed) == EngineConfig() == EngineConfig.from_options({})
    # Each option's entry in --help (the lines from its flags to the next option's).
    entries = re.split(r"\n(?=  -)", run("serve", "--help").stdout)
    shown = {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries if entry.startswith("  -")}
    table = (Path(__file__).parents[1] / "docs" / "operators.md").read_text(encoding="utf-8").splitlines()
    for name, value in ENGINE_DEFAULTS.items():
        flag = "--" + name.replace("_", "-")
        assert re.search(rf"\[default: {value}[;\]]", shown[flag]), (flag, shown[flag])
        row = next(line for line in table if line.startswith("| ") and f"`{flag}" in line.split("|")[1])
        assert re.search(rf"(?<![\d.]){value:g}(?![\d.])", row.split("|")[2]), (flag, row)


def test_pipeline_without_distributed_is_refused_at_start(mlxrt_tiny_checkpoint):
    out = run("serve", str(mlxrt_tiny_checkpoint("qwen3")), "--pipeline")
    assert out.returncode != 0 and "--pipeline" in out.stderr and "--distributed" in out.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    out = run("serve", str(tmp_path / "nothing-here"))
    assert out.returncode != 0 and "not found" in out.stderr
    out = run("serve", "some-org/some-model")
    assert out.returncode != 0 and "some-org/some-model" in out.stderr


def test_model_given_twice_is_refused(mlxrt_tiny_checkpoint):
    out = run("serve", str(mlxrt_tiny_checkpoint("qwen3")), "--model", "/elsewhere")
    assert out.returncode != 0 and "give the model once" in out.stderr


def test_real_server_stream_and_non_stream(mlxrt_tiny_checkpoint, server_process):
    server = server_process(["--model", str(mlxrt_tiny_checkpoint("qwen3"))])
    with httpx.Client(base_url=server.url, timeout=60) as http:
        client = openai_client(http)
        msg = [{"role": "user", "content": "Count to three."}]
        whole = client.chat.completions.create(model="m", messages=msg, max_tokens=10, temperature=0)
        chunks = list(client.chat.completions.create(model="m", messages=msg, max_tokens=10, temperature=0,
                                                     stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
        assert http.get("/health").content == b'{"status": "ok"}'
        # HTTP/1.1 keep-alive: both requests above reused one connection pool.
        assert http.post("/v1/chat/completions", content=b"{oops",
                         headers={"content-type": "application/json"}).status_code == 400
        assert client.chat.completions.create(model="m", messages=msg, max_tokens=2).choices
