"""``mlxrt run [MODEL] [PROMPT]``: chat with a model in the terminal, as ``ollama run`` does.

It talks to the server already listening at ``--url`` (the default ``mlxrt serve`` address)
through its Ollama API, or starts ``mlxrt serve MODEL`` for itself on a free port and stops it
on exit. With a PROMPT (or text piped in) it answers once and exits: the answer on stdout,
the model's reasoning on stderr, so a pipe gets the answer alone. Otherwise it is a chat:
answers stream as they are generated, reasoning shown apart (dimmed, between "Thinking..." and
"...done thinking."), Ctrl-C stops an answer (the connection closes, so the server cancels the
generation) without leaving, ``\"\"\"`` starts and ends multi-line input, and slash commands
change the session (``/?`` lists them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

import attrs
import click

from mlxrt.cli.remote import DEFAULT_URL, OwnServer, Remote, RemoteError, url_option_help

__all__ = ["register", "Session"]

HELP = """Available commands:
  /set parameter NAME VALUE  Set an option (temperature, top_k, top_p, min_p, num_predict, num_ctx,
                             seed, repeat_penalty, repeat_last_n, stop)
  /set system TEXT           Set the system message
  /set think | nothink       Turn the model's reasoning on or off
  /show info                 Show the model's details
  /load MODEL                Switch to another model (clears the conversation)
  /clear                     Clear the conversation
  /bye                       Exit
  /?, /help                  This help

Use \"\"\" to begin and end a multi-line message. Ctrl-C stops an answer; Ctrl-D or /bye exits."""

_INTS = frozenset({"top_k", "num_predict", "num_ctx", "seed", "repeat_last_n"})
_FLOATS = frozenset({"temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"})
DIM, RESET = "\x1b[2m", "\x1b[0m"


@attrs.define
class Session:
    """One conversation: the model, its messages and the options a user set."""

    remote: Remote
    model: str | None
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    options: dict[str, Any] = attrs.field(factory=dict)
    system: str | None = None
    think: bool | None = None

    def body(self) -> dict[str, Any]:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        body: dict[str, Any] = {"model": self.model or "default", "messages": messages, "stream": True}
        if self.options:
            body["options"] = self.options
        if self.think is not None:
            body["think"] = self.think
        return body

    def ask(self, text: str, answer: TextIO, reasoning: TextIO, *, dim: bool) -> None:
        """Stream the answer to ``text``; a Ctrl-C (KeyboardInterrupt) stops it and the turn is
        dropped from the conversation, as is a refused one."""
        self.messages.append({"role": "user", "content": text})
        content: list[str] = []
        thinking = False
        parts = self.remote.stream("/api/chat", self.body())
        try:
            for part in parts:
                message = part.get("message") or {}
                if message.get("thinking"):
                    if not thinking:
                        thinking = True
                        reasoning.write((DIM if dim else "") + "Thinking...\n")
                    reasoning.write(message["thinking"])
                    reasoning.flush()
                if message.get("content"):
                    if thinking:
                        thinking = False
                        reasoning.write("\n...done thinking.\n\n" + (RESET if dim else ""))
                        reasoning.flush()
                    content.append(message["content"])
                    answer.write(message["content"])
                    answer.flush()
        except BaseException:
            parts.close()  # now, not when collected: the server cancels the generation
            self.messages.pop()
            if thinking and dim:
                reasoning.write(RESET)
            raise
        finally:
            answer.write("\n")
            answer.flush()
        self.messages.append({"role": "assistant", "content": "".join(content)})

    def set_parameter(self, name: str, value: str) -> str:
        if name == "stop":
            self.options.setdefault("stop", []).append(value)
            return f"Set parameter 'stop' to '{', '.join(self.options['stop'])}'"
        kind: Callable[[str], Any] | None = int if name in _INTS else float if name in _FLOATS else None
        if kind is None:
            raise ValueError(f"Unknown parameter '{name}'")
        try:
            self.options[name] = kind(value)
        except ValueError:
            raise ValueError(f"Couldn't set parameter: {value!r} is not {'an integer' if kind is int else 'a number'}") \
                from None
        return f"Set parameter '{name}' to '{value}'"

    def info(self) -> str:
        shown = self.remote.post("/api/show", {"model": self.model or "default"})
        details, info = shown.get("details") or {}, shown.get("model_info") or {}
        arch = info.get("general.architecture", details.get("family", "?"))
        rows = [("architecture", arch), ("parameters", details.get("parameter_size") or "?"),
                ("context length", info.get(f"{arch}.context_length", "?")),
                ("quantization", details.get("quantization_level") or "?")]
        lines = ["  Model"] + [f"    {k:<20}{v}" for k, v in rows]
        lines += ["", "  Capabilities"] + [f"    {c}" for c in shown.get("capabilities") or []]
        if self.options:
            lines += ["", "  Parameters"] + [f"    {k:<20}{v}" for k, v in self.options.items()]
        return "\n".join(lines)

    def load(self, model: str) -> None:
        self.remote.post("/api/chat", {"model": model, "messages": []})
        self.model, self.messages = model, []


def _read_message(first: str) -> str:
    """A typed message: one line, or the lines between two ``\"\"\"``."""
    if not first.startswith('"""'):
        return first
    text = first[3:]
    if text.endswith('"""') and text:
        return text[:-3]
    lines = [text] if text else []
    while True:
        line = input("... ")
        if line.endswith('"""'):
            lines.append(line[:-3])
            return "\n".join(lines)
        lines.append(line)


def _command(session: Session, line: str) -> bool:
    """Run a slash command; ``False`` ends the chat."""
    words = line.split()
    verb = words[0]
    try:
        if verb in ("/bye", "/exit"):
            return False
        if verb in ("/?", "/help"):
            click.echo(HELP)
        elif verb == "/clear":
            session.messages = []
            click.echo("Cleared session context")
        elif verb == "/set" and len(words) >= 4 and words[1] == "parameter":
            click.echo(session.set_parameter(words[2], " ".join(words[3:])))
        elif verb == "/set" and len(words) >= 3 and words[1] == "system":
            session.system = line.split(None, 2)[2]
            click.echo("Set system message.")
        elif verb == "/set" and len(words) == 2 and words[1] in ("think", "nothink"):
            session.think = words[1] == "think"
            click.echo(f"Set '{words[1]}' mode.")
        elif verb == "/show" and words[1:] == ["info"]:
            click.echo(session.info())
        elif verb == "/load" and len(words) == 2:
            click.echo(f"Loading model '{words[1]}'")
            session.load(words[1])
        else:
            click.echo(f"Unknown command '{line}'. Type /? for help")
    except (ValueError, RemoteError) as exc:
        click.echo(f"Error: {exc}")
    return True


def _chat(session: Session) -> None:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    dim = sys.stdout.isatty()
    while True:
        try:
            line = input(">>> ")
            text = _read_message(line)
        except KeyboardInterrupt:
            click.echo("\nUse Ctrl + d or /bye to exit.")
            continue
        except EOFError:
            click.echo()
            return
        if not text.strip():
            continue
        if text.startswith("/"):
            if not _command(session, text.strip()):
                return
            continue
        try:
            session.ask(text, sys.stdout, sys.stdout, dim=dim)
        except KeyboardInterrupt:
            continue  # the answer stopped; the chat goes on
        except RemoteError as exc:
            click.echo(f"Error: {exc.message}")


def register(cli: click.Group) -> None:
    @cli.command("run")
    @click.argument("model", required=False)
    @click.argument("prompt", nargs=-1)
    @click.option("--url", envvar="MLXRT_URL", default=DEFAULT_URL, show_default=True, help=url_option_help)
    @click.option("--api-key", envvar="MLXRT_API_KEY", default=None, help="The server's API key (env MLXRT_API_KEY).")
    @click.option("--think/--no-think", default=None, help="Turn the model's reasoning on or off.")
    def run_cmd(model: str | None, prompt: tuple[str, ...], url: str, api_key: str | None,
                think: bool | None) -> None:
        """Chat with MODEL in the terminal; with PROMPT (or text piped in), answer once and exit.

        Talks to the server at --url when one answers, else starts `mlxrt serve MODEL` for itself.
        """
        text = " ".join(prompt)
        if not text and not sys.stdin.isatty():
            text = sys.stdin.read()
        remote = Remote(url, api_key)
        own: OwnServer | None = None
        if not remote.alive():
            click.echo(f"no mlxrt server at {url}: starting one for this chat...", err=True)
            try:
                own = OwnServer(model)
            except RemoteError as exc:
                raise click.ClickException(exc.message) from None
            remote = Remote(own.url)
        session = Session(remote, model, think=think)
        try:
            if text:
                try:
                    session.ask(text, sys.stdout, sys.stderr, dim=False)
                except RemoteError as exc:
                    raise click.ClickException(exc.message) from None
                except KeyboardInterrupt:
                    sys.exit(130)
            else:
                _chat(session)
        finally:
            if own is not None:
                own.stop()
