"""Every request a pinned agent client sent, replayed without Node: each decodes, no 4xx.

The bodies and headers under tests/fixtures/clients/<client>-<version>/ were recorded by
tests/test_agent_clients.py (``MLXRT_CAPTURE_CLIENTS=1``) from the real Claude Code and Codex
CLI; credentials and the user id are scrubbed. Each is posted as it came, to the same path,
with its output limit set to 1 token so the tiny model answers at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "clients"
CAPTURED = sorted(FIXTURES.glob("*/*.json"))
#: Headers a transport sets (or that name the original server), not part of what the client said.
TRANSPORT = frozenset({"host", "content-length", "connection", "accept-encoding", "authorization", "x-api-key"})


def has_system_entries(body: dict) -> bool:
    return any(m.get("role") == "system" for m in body.get("messages", ()) if isinstance(m, dict))


@pytest.fixture(scope="module")
def replay_client(tmp_path_factory):
    from conftest import shared_tokenizer
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host
    from mlxrt.testing import write_tiny_checkpoint

    # The real tokenizer: the clients' ~20k-token prompts stay ~20k tokens.
    model = write_tiny_checkpoint(tmp_path_factory.mktemp("replay") / "qwen3", "qwen3",
                                  tokenizer_dir=shared_tokenizer("qwen3"),
                                  config_overrides={"max_position_embeddings": 131072})
    host = make_host()
    # The bodies name the clients' own models (claude-…, default): the served model answers them.
    app = build_server(host, str(model), {"host": "127.0.0.1", "port": 0})
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client
    app.state.models.stop()


def test_fixtures_are_there():
    names = {p.parent.name for p in CAPTURED}
    assert {"claude-code-2.1.332", "claude-code-2.1.197", "codex-0.171.0"} <= names, names
    # What made Claude Code's first request a 400 is in the replayed bodies (issue 30 item 2).
    for version in ("2.1.332", "2.1.197"):
        assert any(has_system_entries(json.loads(p.read_text())["body"]) for p in CAPTURED
                   if p.parent.name == f"claude-code-{version}"), version


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_captured_request_decodes(path, replay_client):
    captured = json.loads(path.read_text())
    body = dict(captured["body"])
    # Codex sets no output limit: one is added, so the tiny random model stops at once.
    body["max_output_tokens" if captured["path"] == "/v1/responses" else "max_tokens"] = 1
    headers = {k: v for k, v in captured["headers"].items() if k not in TRANSPORT}
    out = replay_client.post(captured["path"], content=json.dumps(body), headers=headers)
    assert out.status_code == 200, out.text[:500]
    assert out.headers["x-mlxrt-cache"].split(";")[0] in ("hit", "partial", "miss")
