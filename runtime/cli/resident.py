"""``mlxrt ps`` (the models a running server holds in memory) and ``mlxrt stop MODEL`` (unload
one now), through the server's Ollama API (``GET /api/ps``; a ``keep_alive: 0`` generate with
no prompt, as ``ollama stop`` sends)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import click

from mlxrt.cli.models import human_bytes
from mlxrt.cli.remote import DEFAULT_URL, Remote, RemoteError, url_option_help

__all__ = ["register", "until_text"]


def until_text(expires_at: str, now: float | None = None) -> str:
    """``expires_at`` as people read it: ``Forever``, ``Now``, ``4 minutes from now``."""
    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return expires_at
    left = when - (time.time() if now is None else now)
    if left > 50 * 365 * 86400:
        return "Forever"
    if left < 1:
        return "Now"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if left >= size:
            n = int(left // size)
            return f"{n} {unit}{'s' if n != 1 else ''} from now"
    return "Now"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("    ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def _resident(remote: Remote) -> list[dict[str, Any]]:
    try:
        return remote.get("/api/ps").get("models") or []
    except RemoteError as exc:
        raise click.ClickException(exc.message) from None


def register(cli: click.Group) -> None:
    url_option = click.option("--url", envvar="MLXRT_URL", default=DEFAULT_URL, show_default=True,
                              help=url_option_help)
    key_option = click.option("--api-key", envvar="MLXRT_API_KEY", default=None,
                              help="The server's API key (env MLXRT_API_KEY).")

    @cli.command("ps")
    @url_option
    @key_option
    def ps_cmd(url: str, api_key: str | None) -> None:
        """List the models a running server holds in memory: name, size, lane, until when."""
        rows = [("NAME", "SIZE", "LANE", "IN USE", "UNTIL")]
        for m in _resident(Remote(url, api_key)):
            rows.append((m.get("name", "?"), human_bytes(m.get("size") or None), str(m.get("lane", "-")),
                         str(m.get("in_use", "-")), until_text(m.get("expires_at", ""))))
        click.echo(_table(rows))

    @cli.command("stop")
    @click.argument("model")
    @url_option
    @key_option
    def stop_cmd(model: str, url: str, api_key: str | None) -> None:
        """Unload MODEL from a running server now (it loads again on its next request)."""
        remote = Remote(url, api_key)
        names = {m.get("name") for m in _resident(remote)} | {m.get("model") for m in _resident(remote)}
        wanted = model if model in names else f"{model}:latest"
        if wanted not in names:
            raise click.ClickException(f"model '{model}' is not loaded (see `mlxrt ps`)")
        try:
            remote.post("/api/generate", {"model": wanted, "keep_alive": 0})
        except RemoteError as exc:
            raise click.ClickException(exc.message) from None
        click.echo(f"stopped {wanted}")
