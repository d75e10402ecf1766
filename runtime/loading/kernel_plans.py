"""What the kernel's install found in a model's weights, kept across starts.

:func:`mlxrt.engine.qmv.install` compares every scale and bias of each kernel layer to find
whether 16 bits hold them exactly and whether the biases are a symmetric format's
(:class:`~mlxrt.engine.qmv.ScalesPlan`): for Gemma 3 270M's 127 layers ~0.065 s of CPU at every
start, the same answer each time for the same files. The answers are kept in
``$MLXRT_HOME/kernel-plans/`` (``~/.cache/mlxrt``), one JSON file per model folder, keyed by the
folder's resolved path, each weight file's name, size and modification time, and the kernel's
interface version: other weights, or another kernel, find no plan and compare again. A plan that
cannot be read or written is not an error: the start compares, as without one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxrt.loading.paths import mlxrt_home

__all__ = ["read_plan", "write_plan"]

log = logging.getLogger("mlxrt.loading")

#: Bumped when a plan's meaning changes (what install does with it).
FORMAT = 1


def _key(folder: Path, kernel_api: int) -> str | None:
    try:
        files = sorted(folder.glob("model*.safetensors"))
        stats = [(f.name, st.st_size, st.st_mtime_ns) for f in files for st in (f.stat(),)]
    except OSError:
        return None
    if not files:
        return None
    source = json.dumps([FORMAT, str(folder.resolve()), kernel_api, stats])
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def _file(key: str) -> Path:
    return mlxrt_home() / "kernel-plans" / f"{key}.json"


def read_plan(folder: Path, kernel_api: int) -> dict[str, Any] | None:
    """The plan an earlier start wrote for ``folder``'s weights as they are now (layer path →
    ``ScalesPlan``), or ``None``."""
    from mlxrt.engine.qmv import ScalesPlan

    key = _key(folder, kernel_api)
    if key is None:
        return None
    try:
        raw = json.loads(_file(key).read_text(encoding="utf-8"))
        return {path: ScalesPlan(narrow=entry["narrow"], centre=float(entry["centre"]))
                for path, entry in raw["layers"].items()
                if entry["narrow"] in (None, "float16", "bfloat16")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_plan(folder: Path, kernel_api: int, plans: Mapping[str, Any]) -> None:
    """Keep ``plans`` (layer path → ``ScalesPlan``) for the next start with ``folder``'s weights
    as they are now; atomically (a concurrent start reads a whole plan or none)."""
    key = _key(folder, kernel_api)
    if key is None or not plans:
        return
    target = _file(key)
    body = {"folder": str(folder), "layers": {path: {"narrow": p.narrow, "centre": p.centre}
                                              for path, p in sorted(plans.items())}}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        log.debug("could not keep the kernel plan of %s: %s", folder, exc)
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, target)
    except OSError as exc:
        log.debug("could not keep the kernel plan of %s: %s", folder, exc)
        Path(tmp).unlink(missing_ok=True)
