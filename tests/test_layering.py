"""Imports run one way: the layers of docs/architecture.md ("Layering"), checked from the source.

The check reads every module of the distribution with :mod:`ast` (it imports nothing of mlxrt,
so it takes well under a second) and fails on

* an import **circle** among mlxrt modules, and
* an import that runs **back up** the layers (a module importing one of a higher layer).

Every import counts: at module level, inside a function (a lazy import defers a circle, it does
not remove it: the two modules still cannot be read, tested or moved apart), and under
``if TYPE_CHECKING:`` (the type checker CI runs resolves those, so a lower layer that names a
higher layer's types depends on it as much as one that calls it; a lower layer that needs such a
type takes a Protocol of its own, as the engine does with :class:`mlxrt.engine.loader.ModelLoader`).
"""

from __future__ import annotations

import ast
import functools
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The layers, lowest first. A module may import its own layer and those below it; a name
#: covers the module and its submodules, the longest name wins, and ``mlxrt`` is the package's
#: own ``__init__`` only (a new root module must be placed here).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # what everything shares: records, errors, the compat fence, metrics, text and the prompt cache
    ("base", ("mlxrt", "mlxrt.records", "mlxrt.errors", "mlxrt.compat", "mlxrt.metrics", "mlxrt.assembly",
              "mlxrt.text", "mlxrt.cache")),
    # the plugin registry: the plugins, their options and state, the hook calls (no model in it)
    ("registry", ("mlxrt.registry",)),
    # the worker that owns MLX; it is handed a loader (mlxrt.engine.loader), never imports loading
    ("engine", ("mlxrt.engine",)),
    # model loading: sources, GGUF, weights, dtype, BLAS, fit; request images
    ("loading", ("mlxrt.loading",)),
    # the served model and the pool of models; templating; serve --distributed
    ("serving", ("mlxrt.serving", "mlxrt.templating", "mlxrt.capabilities", "mlxrt.model_pool",
                 "mlxrt.distributed")),
    # the hook specifications (they name the served model a hook is given) and make_host, which
    # registers them and discovers the plugins
    ("host", ("mlxrt.hookspecs", "mlxrt.host")),
    ("api", ("mlxrt.api",)),
    ("plugins", ("mlxrt.plugins", "mlxrt.families")),
    ("cli", ("mlxrt.cli",)),
    # test support for us and plugin authors: may import anything, nothing imports it
    ("testing", ("mlxrt.testing",)),
]

#: Imports that run back up or close a circle by exception, each (importer, imported) with its
#: reason in a comment; none now. An entry that neither runs up nor closes a circle any more
#: fails the test: delete it.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def _packages(root: Path) -> dict[str, Path]:
    """Each package of the distribution (pyproject's ``packages``) and its folder."""
    with open(root / "pyproject.toml", "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    remap = tool.get("package-dir", {})
    folders = {}
    for name in tool["packages"]:
        base = max((p for p in remap if name == p or name.startswith(p + ".")), key=len)
        rest = name[len(base) + 1:].split(".") if name != base else []
        folders[name] = root.joinpath(remap[base], *rest)
    return folders


def modules(root: Path, packages: Mapping[str, Path]) -> dict[str, Path]:
    """Every module of ``packages`` by dotted name (a package by its own name: its ``__init__``)."""
    found = {}
    for name, folder in packages.items():
        for path in folder.glob("*.py"):
            found[name if path.stem == "__init__" else f"{name}.{path.stem}"] = path
    return found


def _kinds(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
    """Each import statement of ``tree`` with where it runs: ``top``, ``fn`` or ``tc``."""

    def walk(node: ast.AST, kind: str) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "fn")
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "tc" if kind == "top" else kind)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    return walk(tree, "top")


def imports(mods: Mapping[str, Path]) -> dict[tuple[str, str], str]:
    """Every import between two modules of ``mods``: (importer, imported) → where it first runs,
    ``file:line (kind)``. ``from P import N`` imports the module ``P.N`` when there is one, else
    ``P``; a name that is no module resolves to the longest module it starts with."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[tuple[str, str], str] = {}
    for name, path in mods.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node, kind in _kinds(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                found = resolve(target) if target.split(".")[0] == "mlxrt" else None
                if found is not None and found != name:
                    edges.setdefault((name, found), f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
                                                    f":{node.lineno} ({kind})")
    return edges


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int:
    """The index of ``module``'s layer in ``layers``."""
    best: tuple[int, int] | None = None
    for index, (_layer, names) in enumerate(layers):
        for n in names:
            covers = module == n if n == "mlxrt" else (module == n or module.startswith(n + "."))
            if covers and (best is None or len(n) > best[1]):
                best = (index, len(n))
    assert best is not None, f"{module} is in no layer: place it in tests/test_layering.py LAYERS and docs"
    return best[0]


def upward(edges: Mapping[tuple[str, str], str], layers: list[tuple[str, tuple[str, ...]]] = LAYERS
           ) -> dict[tuple[str, str], str]:
    """The imports of ``edges`` that run back up ``layers``."""
    return {e: where for e, where in edges.items() if layer_of(e[1], layers) > layer_of(e[0], layers)}


def circles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The import circles of ``edges``: strongly connected sets of two or more modules (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


@functools.cache
def _edges() -> dict[tuple[str, str], str]:
    return imports(modules(ROOT, _packages(ROOT)))


def test_every_module_has_a_layer():
    mods = modules(ROOT, _packages(ROOT))
    assert len(mods) > 100  # the whole distribution was read, not an empty folder
    for name in mods:
        layer_of(name)


def test_no_import_runs_back_up_the_layers():
    found = upward(_edges())
    unexpected = {f"{a} -> {b}": where for (a, b), where in found.items() if (a, b) not in ALLOWED}
    assert unexpected == {}, "imports that run back up the layers (docs/architecture.md, Layering)"


def test_no_import_circle():
    edges = {e for e in _edges() if e not in ALLOWED}
    assert circles(edges) == []


def test_the_allowed_imports_are_still_needed():
    edges = _edges()
    in_circles = {m for circle in circles(edges) for m in circle}
    needed = set(upward(edges)) | {(a, b) for a, b in edges if a in in_circles and b in in_circles}
    stale = sorted(f"{a} -> {b}" for a, b in ALLOWED - needed)
    assert stale == [], "neither run up the layers nor close a circle any more: delete them from ALLOWED"


def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(tmp_path, {"mlxrt": tmp_path / "runtime", "mlxrt.engine": tmp_path / "runtime" / "engine",
                              "mlxrt.loading": tmp_path / "runtime" / "loading"})


def test_the_checks_see_a_lazy_circle_and_an_import_up(tmp_path):
    """The checks can fail: a circle closed inside a function and a type-only import of a
    higher layer, in a synthetic tree, are both found."""
    mods = _tree(tmp_path, {
        "runtime/__init__.py": "",
        "runtime/records.py": "def f():\n    from . import errors\n",
        "runtime/errors.py": "from mlxrt.records import f\n",
        "runtime/engine/__init__.py": "",
        "runtime/engine/engine.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from mlxrt.loading import Loader\n"),
        "runtime/loading/__init__.py": "from mlxrt.engine import engine\nclass Loader: ...\n",
    })
    edges = imports(mods)
    assert edges[("mlxrt.records", "mlxrt.errors")].endswith("(fn)")
    assert edges[("mlxrt.engine.engine", "mlxrt.loading")].endswith("(tc)")
    assert ("mlxrt.loading", "mlxrt.engine.engine") in edges  # a submodule, not its package
    assert sorted(circles(edges)) == [["mlxrt.engine.engine", "mlxrt.loading"], ["mlxrt.errors", "mlxrt.records"]]
    assert set(upward(edges)) == {("mlxrt.engine.engine", "mlxrt.loading")}
