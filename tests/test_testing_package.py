"""The mlxrt.testing package itself: every module imports on its own, the package's modules import
each other without a circle, and what every pytest run imports (the package and its pytest plugin)
stays light."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "mlxrt.testing"
FOLDER = Path(importlib.util.find_spec(PACKAGE).submodule_search_locations[0])
MODULES = sorted([PACKAGE] + [f"{PACKAGE}.{p.stem}" for p in FOLDER.glob("*.py") if p.stem != "__init__"])
#: What a process that only collects tests must not pay for.
HEAVY = ("mlx", "mlx.core", "mlx_lm.models", "mlx_lm.generate", "transformers", "litestar", "numpy")


def _source(module: str) -> Path:
    return FOLDER / "__init__.py" if module == PACKAGE else FOLDER / f"{module.rsplit('.', 1)[1]}.py"


def _imports(module: str) -> set[str]:
    """The mlxrt.testing modules that ``module`` imports anywhere in its source (at the top, in a
    function, under TYPE_CHECKING): ``from mlxrt.testing import name`` counts as the package."""
    package = module if module == PACKAGE else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(_source(module).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
            if all(f"{base}.{alias.name}" in MODULES for alias in node.names):
                found.discard(base)  # only submodules named: not the package's lazy names
    return {name for name in found if name in MODULES and name != module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node], path = "open", [*path, node]
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt, path)):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_the_package_holds_its_modules():
    assert {"mlxrt.testing.writers", "mlxrt.testing.conformance", "mlxrt.testing.pytest_plugin"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_in_a_fresh_process(module):
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr


def test_no_import_circle_inside_the_package():
    graph = {module: _imports(module) for module in MODULES}
    assert graph["mlxrt.testing._tiny_gemma4_vision"], "the walk sees the vision writer's imports"
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_check_finds_a_circle():
    # the check itself can fail: writers -> vision writer -> writers, as it once was
    assert _cycle({"w": {"v"}, "v": {"w", "f"}, "f": set()}) == ["v", "w", "v"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", ["mlxrt.testing", "mlxrt.testing.pytest_plugin"])
def test_what_every_pytest_run_imports_is_light(module):
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"
