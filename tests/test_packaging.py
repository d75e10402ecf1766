"""Packaging guards: every package folder is listed, room names never import top-level."""

from __future__ import annotations

import importlib
import importlib.util
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    setuptools = PYPROJECT["tool"]["setuptools"]
    found = set()
    for dotted, folder in setuptools["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            if any(part.startswith(".") or "-" in part for part in rel.parts):
                continue  # example plugin projects are separate distributions
            found.add(".".join([dotted, *rel.parts]) if rel.parts else dotted)
    assert found == set(setuptools["packages"])


@pytest.mark.parametrize("room", ["api", "runtime", "families", "plugins"])
def test_room_names_are_not_top_level_packages(room):
    assert importlib.util.find_spec(room) is None


def test_every_module_imports():
    import mlxrt

    root = Path(mlxrt.__file__).parent
    names = []
    for dotted in PYPROJECT["tool"]["setuptools"]["packages"]:
        names.append(dotted)
        mapped = PYPROJECT["tool"]["setuptools"]["package-dir"].get(dotted)
        folder = REPO / mapped if mapped else root.joinpath(*dotted.split(".")[1:])
        # __main__ runs the command line when imported
        names += [f"{dotted}.{p.stem}" for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")]
    for name in names:
        importlib.import_module(name)


def test_entry_points_register_the_builtins():
    eps = PYPROJECT["project"]["entry-points"]["mlxrt"]
    assert {"qwen", "minicpm5", "gemma4", "diffusion_gemma", "openai", "anthropic", "responses"} <= set(eps)
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for ep in entry_points(group="mlxrt")}
    for name, target in eps.items():
        assert installed.get(name) == target


def test_hook_call_sites_are_confined():
    allowed = {"runtime/host.py", "runtime/engine/sampling.py", "runtime/templating.py", "runtime/loading/__init__.py",
               "runtime/cli/__init__.py", "runtime/capabilities.py", "runtime/serving.py",
               "api/app.py", "api/observers.py", "api/pipeline.py"}
    offenders = []
    for folder in ("runtime", "api", "families", "plugins"):
        for path in (REPO / folder).rglob("*.py"):
            rel = str(path.relative_to(REPO))
            text = path.read_text()
            if (".hook.mlxrt_" in text or "first_answer(" in text or ".collect(\"mlxrt_" in text
                    or ".notify(\"mlxrt_" in text) \
                    and rel not in allowed and "def first_answer" not in text:
                offenders.append(rel)
    assert offenders == []


def test_type_checkers_read_this_versions_link_tree():
    """scripts/typecheck (CI's mypy) and pyright read setuptools' strict-editable link tree,
    whose folder is named for the version: a version bump must rename it in both settings, and
    every module the checker is told to check must be a package of the distribution."""
    project = PYPROJECT["project"]
    tree = f"build/__editable__.{project['name']}-{project['version']}-py3-none-any"
    mypy = PYPROJECT["tool"]["mypy"]
    assert mypy["mypy_path"] == tree
    assert tree in PYPROJECT["tool"]["pyright"]["extraPaths"]
    packages = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert all(name in packages or name.rpartition(".")[0] in packages for name in mypy["packages"])
