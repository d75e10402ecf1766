"""The log says why (issue 43): every 4xx and 5xx access line carries the error's reason at
INFO, and each ignored body field is logged once per field name."""

from __future__ import annotations

import logging

from mlxrt.api.observe import error_reason


def _access(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "mlxrt.access"]


def test_a_refusal_is_logged_with_its_reason(mlxrt_client, caplog):
    caplog.set_level(logging.INFO, logger="mlxrt.access")
    assert mlxrt_client.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    assert mlxrt_client.post("/v1/messages", json={"model": "m", "messages": [{"role": "user", "content": "x"}]}
                             ).status_code == 400
    assert mlxrt_client.get("/nowhere").status_code == 404
    lines = [r.getMessage() for r in _access(caplog)]
    assert any(m.startswith("POST /v1/chat/completions 400 ") and m.endswith(
        " ms: messages must contain at least one message") for m in lines), lines
    assert any(m.startswith("POST /v1/messages 400 ") and m.endswith(": max_tokens: Field required") for m in lines), lines
    assert any(m.startswith("GET /nowhere 404 ") and m.endswith(": not found") for m in lines), lines
    refused = next(r for r in _access(caplog) if r.status == 400)
    assert refused.levelno == logging.INFO and refused.reason == "messages must contain at least one message"
    ok = [m for m in lines if " 200 " in m]
    assert all(m.endswith(" ms") for m in ok)


def test_ignored_fields_are_logged_once_per_name(mlxrt_client, caplog):
    caplog.set_level(logging.INFO, logger="mlxrt.access")
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "frobnicate": 1}
    for extra in ({}, {}, {"wibble": 2}):
        resp = mlxrt_client.post("/v1/chat/completions", json={**body, **extra})
        assert resp.status_code == 200 and "frobnicate" in resp.headers["x-mlxrt-ignored"]
    said = [r.getMessage() for r in _access(caplog) if "not read by mlxrt" in r.getMessage()]
    assert said == ["request field 'frobnicate' is not read by mlxrt (named in x-mlxrt-ignored; logged once per name)",
                    "request field 'wibble' is not read by mlxrt (named in x-mlxrt-ignored; logged once per name)"]


def test_error_reason_reads_every_shape():
    assert error_reason(b'{"error": {"message": "a\\nb", "type": "x"}}') == "a b"
    assert error_reason(b'{"type": "error", "error": {"type": "x", "message": "prompt is too long"}}') == \
        "prompt is too long"
    assert error_reason(b"plain text") == "plain text"
    assert error_reason(b"x" * 600).endswith("…")
