"""The vault: a git repository of Markdown articles, one file per article plus an index.

Git is driven through its command line (``subprocess``), never by writing its objects. Files
are replaced atomically (write beside, then rename), so a run stopped at any moment leaves
each article either as it was or as it is meant to be. Rendering is a pure function of the
store's rows, so the same store always gives byte-identical files (and cross-links).
"""

from __future__ import annotations

import os
import re
import subprocess
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["Vault", "VaultError", "slugify", "render_article", "render_index", "link_mentions"]

VAULT_DIR = "vault"
#: The commits' author, so a server without git configured can still commit.
_IDENTITY = {"GIT_AUTHOR_NAME": "mlxrt memory", "GIT_AUTHOR_EMAIL": "memory@mlxrt.invalid",
             "GIT_COMMITTER_NAME": "mlxrt memory", "GIT_COMMITTER_EMAIL": "memory@mlxrt.invalid"}


class VaultError(RuntimeError):
    """A git command failed (its stderr is the message)."""


def slugify(name: str) -> str:
    """``"Ada Lovelace"`` → ``"ada-lovelace"``: ASCII letters and digits joined by dashes."""
    text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80]


def _mention(title: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w\[]){re.escape(title)}(?![\w\]])", re.IGNORECASE)


def link_mentions(text: str, titles: Mapping[str, str], own: str) -> list[str]:
    """The slugs (sorted) of the other articles whose title ``text`` mentions as a whole word."""
    return sorted(slug for slug, title in titles.items() if slug != own and _mention(title).search(text))


def render_article(*, slug: str, title: str, kind: str, summary: str, sections: Sequence[tuple[str, str]],
                   links: Sequence[str], titles: Mapping[str, str]) -> str:
    """One article's Markdown. The first mention of each linked article in the body becomes a
    link; "See also" lists every link, in slug order (deterministic)."""
    pending = {dst: titles[dst] for dst in links if dst in titles}

    def wikify(text: str) -> str:
        # Longest titles first, so "Ada Lovelace" links before "Ada" could claim its words.
        for dst, name in sorted(pending.items(), key=lambda item: (-len(item[1]), item[0])):
            text, n = _mention(name).subn(lambda m, d=dst: f"[{m.group(0)}]({d}.md)", text, count=1)
            if n:
                del pending[dst]
        return text

    out = [f"# {title}", "", f"*{kind}*", "", wikify(summary.strip()), ""]
    for heading, body in sections:
        out += [f"## {heading}", "", wikify(body.strip()) if body.strip() else "_Nothing recorded yet._", ""]
    if links:
        out += ["## See also", ""] + [f"- [{titles[d]}]({d}.md)" for d in links if d in titles] + [""]
    return "\n".join(out)


def render_index(articles: Sequence[tuple[str, str, str]]) -> str:
    """The vault's ``index.md``: every article (slug, title, kind) by title."""
    lines = ["# Memory", "", f"{len(articles)} articles.", ""]
    lines += [f"- [{title}]({slug}.md) ({kind})" for slug, title, kind in sorted(articles, key=lambda a: (a[1].lower(), a[0]))]
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
        # A git command killed with its process leaves its lock; the caller owns the folder
        # (MemoryService holds its lock file), so no other git can be running here.
        (vault.root / ".git" / "index.lock").unlink(missing_ok=True)
        for partial in vault.root.glob(".*.partial"):
            partial.unlink()
        return vault

    def git(self, *args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=self.root, capture_output=True, text=True,
                                  env={**os.environ, **_IDENTITY}, timeout=60)
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
