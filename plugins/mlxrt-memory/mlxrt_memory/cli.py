"""``mlxrt memory status|synthesize|export``.

``status`` and ``export`` read the store directly (safe beside a running server: SQLite WAL
readers never block its writer); ``synthesize`` asks a running server, which holds the model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

__all__ = ["register"]

_DIR = click.option("--memory-dir", required=True, type=click.Path(file_okay=False, exists=True),
                    help="The folder given to 'mlxrt serve --memory-dir'.")
_KEY = click.option("--api-key", default=None, envvar="MLXRT_API_KEY",
                    help="Read this API key's memory (a server with keys keeps each key's apart).")


def _store(folder: str, api_key: str | None = None) -> Any:
    import hashlib

    from mlxrt_memory.store import STORE_FILE, MemoryStore
    from mlxrt_memory.synthesis import CALLERS_DIR

    if api_key:
        folder = str(Path(folder) / CALLERS_DIR / hashlib.sha256(api_key.encode()).hexdigest()[:32])
    path = Path(folder) / STORE_FILE
    if not path.exists():
        raise click.ClickException(f"no memory store in {folder} (expected {STORE_FILE}; "
                                   "start 'mlxrt serve --memory-dir' on it first)")
    return MemoryStore(path)


def register(cli: click.Group) -> None:
    @cli.group("memory")
    def memory() -> None:
        """The memory store of 'mlxrt serve --memory-dir' (mlxrt-memory plugin)."""

    @memory.command("status")
    @_DIR
    @_KEY
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    def status(memory_dir: str, api_key: str | None, as_json: bool) -> None:
        """What the store holds and what the next synthesis run would take up."""
        store = _store(memory_dir, api_key)
        counts = store.counts()
        last = store.rows("SELECT id, status, started_at, finished_at, commit_hash FROM runs ORDER BY id DESC LIMIT 1")
        out = {**counts, "last_run": dict(last[0]) if last else None}
        if as_json:
            click.echo(json.dumps(out))
            return
        for name, value in counts.items():
            click.echo(f"{name:14} {value}")
        if last:
            run = last[0]
            click.echo(f"last run       #{run['id']} {run['status']}"
                       + (f", commit {run['commit_hash'][:12]}" if run["commit_hash"] else ""))

    @memory.command("export")
    @_DIR
    @_KEY
    @click.option("--out", type=click.File("w"), default="-", help="Write here (default: stdout).")
    def export(memory_dir: str, api_key: str | None, out: Any) -> None:
        """Every captured turn as one JSON object per line, oldest first."""
        for row in _store(memory_dir, api_key).rows("SELECT * FROM turns ORDER BY id"):
            record = dict(row)
            record["messages"] = json.loads(record["messages"])
            out.write(json.dumps(record, ensure_ascii=False) + "\n")

    @memory.command("synthesize")
    @click.option("--url", default="http://127.0.0.1:8080", show_default=True, help="The running server.")
    @click.option("--dry", is_flag=True, help="Plan every stage; write nothing.")
    @click.option("--api-key", default=None, envvar="MLXRT_API_KEY", help="The server's API key, if it has one.")
    def synthesize(url: str, dry: bool, api_key: str | None) -> None:
        """Run a synthesis on a running server and print its events."""
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            with httpx.stream("POST", f"{url.rstrip('/')}/v1/memory/synthesize", params={"dry": int(dry)},
                              json={}, headers=headers, timeout=httpx.Timeout(10, read=None)) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise click.ClickException(f"{resp.status_code}: {_message(resp.text)}")
                failed = _print_events(resp.iter_lines())
        except httpx.HTTPError as exc:
            raise click.ClickException(f"cannot reach {url}: {exc}") from None
        if failed:
            sys.exit(1)


def _message(body: str) -> str:
    try:
        error = json.loads(body).get("error")
    except (json.JSONDecodeError, AttributeError):
        return body
    return error.get("message", body) if isinstance(error, dict) else str(error or body)


def _print_events(lines: Any) -> bool:
    """Print each event; ``True`` when the run failed."""
    for line in lines:
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            return False
        event = json.loads(payload)
        kind = event["type"]
        if kind == "summary":
            click.echo(f"summary: {json.dumps({k: v for k, v in event.items() if k != 'type'})}")
        elif kind == "error":
            click.echo(f"error in {event.get('stage') or 'the run'}: {event['message']}", err=True)
            return True
        else:
            click.echo(f"{kind:5} {event.get('stage') or '-':14} {event['message']}")
    return True  # the stream ended without [DONE]
