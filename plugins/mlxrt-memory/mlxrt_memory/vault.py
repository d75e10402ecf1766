"""The vault: a git repository of Markdown articles, one file per article plus an index.

Git is driven through its command line (``subprocess``), never by writing its objects. Files
are replaced atomically (write beside, then rename), so a run stopped at any moment leaves
each article either as it was or as it is meant to be. Rendering is a pure function of the
store's rows, so the same store always gives byte-identical files (and cross-links).

Nothing the model wrote is trusted: every name, summary, heading and fact is rendered as plain
text (one line, HTML and Markdown syntax escaped), so it can neither carry markup (``<script>``,
``<img onerror>``, ``[x](javascript:…)``) nor forge the article's own structure (a ``## See
also`` section). Nothing in the folder runs: git is called with hooks, fsmonitor, filters and
every configuration but our own turned off, and the repository's config is rewritten at open.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import subprocess
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["Vault", "VaultError", "slugify", "render_article", "render_index", "link_mentions", "plain"]

VAULT_DIR = "vault"
#: The commits' author, so a server without git configured can still commit.
_IDENTITY = {"GIT_AUTHOR_NAME": "mlxrt memory", "GIT_AUTHOR_EMAIL": "memory@mlxrt.invalid",
             "GIT_COMMITTER_NAME": "mlxrt memory", "GIT_COMMITTER_EMAIL": "memory@mlxrt.invalid"}
#: Only this process's own settings: no system or user config, no prompts, no inherited GIT_DIR.
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            "GIT_ATTR_NOSYSTEM": "1", **_IDENTITY}
#: Whatever a planted ``.git/config`` says, nothing runs: no hooks, no fsmonitor, no pager,
#: editor, signing, attributes file, or automatic maintenance.
_GIT_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
             "-c", "core.attributesFile=/dev/null", "-c", "core.pager=cat", "-c", "core.editor=true",
             "-c", "commit.gpgSign=false", "-c", "gc.auto=0", "-c", "maintenance.auto=false",
             "-c", "core.sshCommand=false", "-c", "diff.external=", "-c", "credential.helper=",
             "-c", "protocol.allow=never")
#: ``.git/config`` as the vault needs it, written at every open (a planted one is replaced).
_GIT_CONFIG = """[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
"""
#: Slugs the vault's own files take (``index.md``).
_RESERVED = frozenset({"index"})
#: A slug's longest UTF-8 form; longer names end in a digest of the whole name.
_SLUG_BYTES = 80


class VaultError(RuntimeError):
    """A git command failed (its stderr is the message)."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def slugify(name: str) -> str:
    """``"Ada Lovelace"`` → ``"ada-lovelace"``: letters and digits joined by dashes.

    Names written in ASCII letters (accents dropped: ``"José"`` → ``"jose"``) keep ASCII slugs;
    a name with other letters keeps them (``"Москва"`` → ``"москва"``). A slug longer than 80
    bytes is cut and ends in a digest of the whole name, so two names sharing their first 80
    characters stay two articles; a name whose slug would be a vault file's (``"Index"``) gets
    a digest too. ``""`` only for a name with no letter or digit at all.
    """
    letters = [c for c in unicodedata.normalize("NFKD", name) if c.isalnum()]
    if all(c.isascii() for c in letters):
        text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
        slug = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    else:
        slug = re.sub(r"[\W_]+", "-", unicodedata.normalize("NFKC", name).casefold()).strip("-")
    if not slug:
        return ""
    if len(slug.encode()) > _SLUG_BYTES:
        cut = slug.encode()[:_SLUG_BYTES - 9].decode("utf-8", "ignore").rstrip("-")
        return f"{cut}-{_digest(name)}"
    if slug in _RESERVED:
        return f"{slug}-{_digest(name)}"
    return slug


_LEADING = re.compile(r"^[#>+\-*=|]")


def plain(text: str) -> str:
    """Model text as one line of plain Markdown text: whitespace runs (newlines included) become
    one space, ``& < >`` HTML entities, Markdown's inline syntax (``\\ ` * _ [ ]``) escaped, and a
    start that would open a block (``#``, ``>``, ``-``, ``1.`` …) escaped."""
    text = " ".join(text.split())
    text = html.escape(text, quote=False)
    text = re.sub(r"([\\`*_\[\]])", r"\\\1", text)
    if numbered := re.match(r"\d+(?=[.)])", text):  # "1. x" would open a list: "1\. x"
        return f"{numbered.group(0)}\\{text[numbered.end():]}"
    return _LEADING.sub(lambda m: "\\" + m.group(0), text)


def _mention(title: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w\[]){re.escape(title)}(?![\w\]])", re.IGNORECASE)


def link_mentions(text: str, titles: Mapping[str, str], own: str) -> list[str]:
    """The slugs (sorted) of the other articles whose title ``text`` mentions as a whole word."""
    return sorted(slug for slug, title in titles.items() if slug != own and _mention(title).search(text))


def render_article(*, slug: str, title: str, kind: str, summary: str, sections: Sequence[tuple[str, str]],
                   links: Sequence[str], titles: Mapping[str, str]) -> str:
    """One article's Markdown. The first mention of each linked article in the body becomes a
    link; "See also" lists every link, in slug order (deterministic). Every text the model
    wrote is :func:`plain`; a section's body is its bullets (``- fact`` lines)."""
    pending = {dst: plain(titles[dst]) for dst in links if dst in titles}

    def wikify(text: str) -> str:
        # Longest titles first, so "Ada Lovelace" links before "Ada" could claim its words.
        for dst, name in sorted(pending.items(), key=lambda item: (-len(item[1]), item[0])):
            text, n = _mention(name).subn(lambda m, d=dst: f"[{m.group(0)}]({d}.md)", text, count=1)
            if n:
                del pending[dst]
        return text

    def bullets(body: str) -> str:
        return "\n".join(f"- {plain(line.removeprefix('- '))}" for line in body.splitlines() if line.strip())

    out = [f"# {plain(title)}", "", f"*{plain(kind)}*", "", wikify(plain(summary)), ""]
    for heading, body in sections:
        out += [f"## {plain(heading)}", "", wikify(bullets(body)) if body.strip() else "_Nothing recorded yet._", ""]
    if links:
        out += ["## See also", ""] + [f"- [{plain(titles[d])}]({d}.md)" for d in links if d in titles] + [""]
    return "\n".join(out)


def render_index(articles: Sequence[tuple[str, str, str]]) -> str:
    """The vault's ``index.md``: every article (slug, title, kind) by title."""
    lines = ["# Memory", "", f"{len(articles)} articles.", ""]
    lines += [f"- [{plain(title)}]({slug}.md) ({plain(kind)})"
              for slug, title, kind in sorted(articles, key=lambda a: (a[1].lower(), a[0]))]
    return "\n".join(lines) + "\n"


class Vault:
    """The git working tree at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def open(cls, folder: Path) -> Vault:
        vault = cls(folder / VAULT_DIR)
        vault.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(vault.root, 0o700)  # the articles say what the conversations said
        if not (vault.root / ".git").exists():
            vault.git("init", "--quiet")
        vault.disarm()
        # A git command killed with its process leaves its lock; the caller owns the folder
        # (MemoryService holds its lock file), so no other git can be running here.
        (vault.root / ".git" / "index.lock").unlink(missing_ok=True)
        for partial in vault.root.glob(".*.partial"):
            partial.unlink()
        return vault

    def disarm(self) -> None:
        """Undo what may have been planted in the repository: our config only (a planted one may
        name a filter or fsmonitor command), no attributes (a filter driver is a command). Hooks
        are never called (``core.hooksPath=/dev/null`` on every command)."""
        git_dir = self.root / ".git"
        if git_dir.is_dir():
            (git_dir / "config").write_text(_GIT_CONFIG, encoding="utf-8")
            (git_dir / "info" / "attributes").unlink(missing_ok=True)
        (self.root / ".gitattributes").unlink(missing_ok=True)

    def git(self, *args: str) -> str:
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
            done = subprocess.run(["git", *_GIT_SAFE, *args], cwd=self.root, capture_output=True, text=True,
                                  env={**env, **_GIT_ENV}, timeout=60, stdin=subprocess.DEVNULL)
        except FileNotFoundError as exc:
            raise VaultError("the git command is not installed") from exc
        if done.returncode != 0:
            raise VaultError(f"git {args[0]} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def write(self, name: str, text: str) -> bool:
        """Replace ``name`` with ``text`` atomically; ``False`` when it already held exactly that."""
        path = self.root / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            return False
        partial = path.with_name(f".{path.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a leftover partial keeps its old mode through O_CREAT
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(partial, path)
        return True

    def changes(self) -> list[str]:
        """Paths that differ from the last commit (untracked ones included)."""
        return [line[3:] for line in self.git("status", "--porcelain", "--untracked-files=all").splitlines()
                if not line[3:].startswith(".")]

    def commit(self, message: str) -> str | None:
        """Commit every change; the new commit's hash, or ``None`` when nothing changed."""
        self.disarm()  # whatever was planted while the server ran
        if not self.changes():
            return None
        self.git("add", "--all", "--", "*.md")
        self.git("commit", "--quiet", "-m", message)
        return self.git("rev-parse", "HEAD").strip()

    def head(self) -> str | None:
        try:
            return self.git("rev-parse", "--verify", "--quiet", "HEAD").strip() or None
        except VaultError:
            return None
