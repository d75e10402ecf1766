"""The synthesis stages, in order: ingest, segment, extract, route, create, section-route,
patch, link, wikify, commit.

Each stage reads its inputs from the store and writes its outputs there (the vault, for the
last two), marking each input done in the transaction that records its output: a stage
interrupted anywhere is resumed by the next run without losing or repeating an item. Each
has a ``pending`` query (what a dry run reports) and a ``run`` function returning how many
items it handled. Only extract, create and section-route ask the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt_memory.editor import Editor
from mlxrt_memory.store import MemoryStore
from mlxrt_memory.vault import Vault, link_mentions, render_article, render_index, slugify

if TYPE_CHECKING:  # sqlite3 is imported where the store opens a connection, not when routes register
    import sqlite3

__all__ = ["StageContext", "Stage", "STAGES", "STAGE_NAMES"]

#: A segment is at most this many characters of a turn's text (paragraphs are kept whole
#: when they fit), so one extraction prompt stays small.
SEGMENT_CHARS = 1200


@attrs.define
class StageContext:
    store: MemoryStore
    vault: Vault
    editor: Editor
    run_id: int
    log: Callable[[str], None]


@attrs.frozen
class Stage:
    name: str
    #: What the stage would work on now (a dry run's plan).
    pending: str
    run: Callable[[StageContext], int]
    unit: str


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def ingest(ctx: StageContext) -> int:
    """Each new turn's new text (its last user message and the answer) becomes a document:
    earlier messages of a conversation were ingested with the turn that answered them."""
    rows = ctx.store.rows("SELECT id, messages, content FROM turns"
                          " WHERE id NOT IN (SELECT turn_id FROM documents) ORDER BY id")
    docs = [(r["id"], f"User: {_last_user_text(json.loads(r['messages']))}\n\nAssistant: {r['content']}".strip())
            for r in rows]
    ctx.store.write(lambda c: c.executemany("INSERT OR IGNORE INTO documents (turn_id, text) VALUES (?, ?)", docs))
    return len(docs)


def _segments(text: str) -> list[str]:
    out: list[str] = []
    for para in (p.strip() for p in text.split("\n\n")):
        while para:
            piece, para = para[:SEGMENT_CHARS], para[SEGMENT_CHARS:]
            if out and len(out[-1]) + 2 + len(piece) <= SEGMENT_CHARS:
                out[-1] += "\n\n" + piece
            else:
                out.append(piece)
    return out


def segment(ctx: StageContext) -> int:
    rows = ctx.store.rows("SELECT turn_id, text FROM documents WHERE segmented = 0 ORDER BY turn_id")
    total = 0
    for row in rows:
        pieces = _segments(row["text"])

        def save(c: sqlite3.Connection, turn: int = row["turn_id"], pieces: list[str] = pieces) -> None:
            c.executemany("INSERT OR IGNORE INTO segments (turn_id, idx, text) VALUES (?, ?, ?)",
                          [(turn, i, t) for i, t in enumerate(pieces)])
            c.execute("UPDATE documents SET segmented = 1 WHERE turn_id = ?", (turn,))

        ctx.store.write(save)
        total += len(pieces)
    return total


def extract(ctx: StageContext) -> int:
    rows = ctx.store.rows("SELECT id, text FROM segments WHERE extracted = 0 ORDER BY id")
    found = 0
    for row in rows:
        entities = ctx.editor.extract(row["text"])
        facts = [(row["id"], e.name, e.kind, f) for e in entities for f in e.facts if slugify(e.name)]
        # A name with no letter or digit cannot name an article: say so, never drop it silently.
        for nameless in sorted({e.name for e in entities if not slugify(e.name)}):
            ctx.log(f"segment {row['id']}: skipped the facts of {nameless!r}: its name has no letter or digit")

        def save(c: sqlite3.Connection, seg: int = row["id"], facts: list[Any] = facts) -> None:
            c.executemany("INSERT OR IGNORE INTO facts (segment_id, entity, kind, fact) VALUES (?, ?, ?, ?)", facts)
            c.execute("UPDATE segments SET extracted = 1 WHERE id = ?", (seg,))

        ctx.store.write(save)
        ctx.log(f"segment {row['id']}: {len(entities)} entities, {len(facts)} facts")
        found += len(facts)
    return found


def route(ctx: StageContext) -> int:
    """Each new fact goes to its entity's article: ``patch`` an article that exists, ``create``
    one that does not (deterministic: the entity name's slug is the article's)."""
    rows = ctx.store.rows("SELECT id, entity FROM facts WHERE slug IS NULL ORDER BY id")
    existing = {r["slug"] for r in ctx.store.rows("SELECT slug FROM articles")}
    routes = [(slugify(r["entity"]), "patch" if slugify(r["entity"]) in existing else "create", r["id"])
              for r in rows]
    ctx.store.write(lambda c: c.executemany("UPDATE facts SET slug = ?, action = ? WHERE id = ?", routes))
    return len(routes)


def create(ctx: StageContext) -> int:
    """Outline one article per new slug (summary and section headings) from its facts; the
    facts themselves are placed by section-route and written by patch."""
    slugs = [r["slug"] for r in ctx.store.rows(
        "SELECT DISTINCT slug FROM facts WHERE action = 'create'"
        " AND slug NOT IN (SELECT slug FROM articles) ORDER BY slug")]
    for slug in slugs:
        facts = ctx.store.rows("SELECT entity, kind, fact FROM facts WHERE slug = ? ORDER BY id", slug)
        title, kind = facts[0]["entity"], facts[0]["kind"]
        outline = ctx.editor.outline(title, kind, [f["fact"] for f in facts])

        def save(c: sqlite3.Connection, slug: str = slug, title: str = title, kind: str = kind,
                 outline: Any = outline) -> None:
            c.execute("INSERT OR IGNORE INTO articles (slug, title, kind, summary, created_run) VALUES (?, ?, ?, ?, ?)",
                      (slug, title, kind, outline.summary, ctx.run_id))
            c.executemany("INSERT OR IGNORE INTO sections (slug, heading, position) VALUES (?, ?, ?)",
                          [(slug, h, i) for i, h in enumerate(outline.sections)])
            c.execute("UPDATE facts SET action = 'patch' WHERE slug = ? AND action = 'create'", (slug,))

        ctx.store.write(save)
        ctx.log(f"created {slug}: {len(outline.sections)} sections")
    return len(slugs)


def section_route(ctx: StageContext) -> int:
    rows = ctx.store.rows("SELECT f.id, f.fact, f.slug, a.title FROM facts f JOIN articles a ON a.slug = f.slug"
                          " WHERE f.action = 'patch' AND f.section IS NULL ORDER BY f.id")
    for row in rows:
        headings = [r["heading"] for r in ctx.store.rows(
            "SELECT heading FROM sections WHERE slug = ? ORDER BY position", row["slug"])]
        # One section leaves nothing to choose: no model call.
        section = headings[0] if len(headings) == 1 else ctx.editor.choose_section(row["title"], headings, row["fact"])
        ctx.store.write(lambda c, s=section, i=row["id"]: c.execute("UPDATE facts SET section = ? WHERE id = ?", (s, i)))
    return len(rows)


def patch(ctx: StageContext) -> int:
    """Append each placed fact to its section as a bullet; a fact the section already states
    is not repeated."""
    rows = ctx.store.rows("SELECT id, slug, section, fact FROM facts WHERE section IS NOT NULL AND patched = 0"
                          " ORDER BY id")
    for row in rows:
        def save(c: sqlite3.Connection, row: sqlite3.Row = row) -> None:
            (body,) = c.execute("SELECT body FROM sections WHERE slug = ? AND heading = ?",
                                (row["slug"], row["section"])).fetchone()
            bullet = f"- {' '.join(row['fact'].split())}"  # one line: a fact is one bullet
            if bullet not in body.splitlines():
                c.execute("UPDATE sections SET body = ? WHERE slug = ? AND heading = ?",
                          ((body + "\n" if body else "") + bullet, row["slug"], row["section"]))
            c.execute("UPDATE facts SET patched = 1 WHERE id = ?", (row["id"],))

        ctx.store.write(save)
    return len(rows)


def _article_text(store: MemoryStore, slug: str, summary: str) -> str:
    return "\n".join([summary, *(r["body"] for r in store.rows("SELECT body FROM sections WHERE slug = ?", slug))])


def link(ctx: StageContext) -> int:
    """Recompute every cross-link: A links to B when A's text names B's title (whole words)."""
    articles = ctx.store.rows("SELECT slug, title, summary FROM articles ORDER BY slug")
    titles = {a["slug"]: a["title"] for a in articles}
    pairs = [(a["slug"], dst) for a in articles
             for dst in link_mentions(_article_text(ctx.store, a["slug"], a["summary"]), titles, a["slug"])]

    def save(c: sqlite3.Connection) -> None:
        c.execute("DELETE FROM links")
        c.executemany("INSERT INTO links (src, dst) VALUES (?, ?)", pairs)

    ctx.store.write(save)
    return len(pairs)


def wikify(ctx: StageContext) -> int:
    """Render every article (and the index) into the vault; only changed files are written."""
    articles = ctx.store.rows("SELECT slug, title, kind, summary FROM articles ORDER BY slug")
    titles = {a["slug"]: a["title"] for a in articles}
    changed = 0
    for a in articles:
        sections = [(r["heading"], r["body"]) for r in ctx.store.rows(
            "SELECT heading, body FROM sections WHERE slug = ? ORDER BY position", a["slug"])]
        links = [r["dst"] for r in ctx.store.rows("SELECT dst FROM links WHERE src = ? ORDER BY dst", a["slug"])]
        text = render_article(slug=a["slug"], title=a["title"], kind=a["kind"], summary=a["summary"],
                              sections=sections, links=links, titles=titles)
        changed += ctx.vault.write(f"{a['slug']}.md", text)
    changed += ctx.vault.write("index.md", render_index([(a["slug"], a["title"], a["kind"]) for a in articles]))
    return changed


def commit(ctx: StageContext) -> int:
    n = ctx.store.scalar("SELECT COUNT(*) FROM articles")
    head = ctx.vault.commit(f"memory: synthesis run {ctx.run_id} ({n} articles)")
    if head is not None:
        ctx.store.write(lambda c: c.execute("UPDATE runs SET commit_hash = ? WHERE id = ?", (head, ctx.run_id)))
        ctx.log(f"committed {head[:12]}")
    return 0 if head is None else 1


STAGES: tuple[Stage, ...] = (
    Stage("ingest", "SELECT COUNT(*) FROM turns WHERE id NOT IN (SELECT turn_id FROM documents)", ingest, "turns"),
    Stage("segment", "SELECT COUNT(*) FROM documents WHERE segmented = 0", segment, "segments"),
    Stage("extract", "SELECT COUNT(*) FROM segments WHERE extracted = 0", extract, "facts"),
    Stage("route", "SELECT COUNT(*) FROM facts WHERE slug IS NULL", route, "facts"),
    Stage("create", "SELECT COUNT(DISTINCT slug) FROM facts WHERE action = 'create'"
                    " AND slug NOT IN (SELECT slug FROM articles)", create, "articles"),
    Stage("section-route", "SELECT COUNT(*) FROM facts WHERE action = 'patch' AND section IS NULL",
          section_route, "facts"),
    Stage("patch", "SELECT COUNT(*) FROM facts WHERE section IS NOT NULL AND patched = 0", patch, "facts"),
    Stage("link", "SELECT COUNT(*) FROM articles", link, "links"),
    Stage("wikify", "SELECT COUNT(*) FROM articles", wikify, "files"),
    Stage("commit", "SELECT COUNT(*) FROM articles", commit, "commits"),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
