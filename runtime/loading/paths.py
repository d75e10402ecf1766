"""Where mlxrt keeps files: its own cache root, the Hugging Face hub cache, which files of a
repo a model needs, and the local repos a name picks (:func:`match_local_repo`, shared by the
HF cache and the GGUF stores).

Its own module so that :mod:`mlxrt.loading` and the sources it calls (downloads, the embedded
model) share them without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlxrt.errors import ModelLoadError

__all__ = ["MODEL_FILE_PATTERNS", "hf_cache_dir", "mlxrt_home", "local_repo_ids", "match_local_repo"]

#: The files of a repo a model needs: what a serve-time download and `mlxrt get` fetch.
MODEL_FILE_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer.model", "*.tiktoken"]


def mlxrt_home() -> Path:
    """mlxrt's own cache root: ``$MLXRT_HOME``, default ``~/.cache/mlxrt``."""
    home = os.environ.get("MLXRT_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "mlxrt"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now (huggingface_hub reads it
    once, at import): ``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` (default ``~/.cache/huggingface/hub``)."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        cache = os.path.join(home, "hub")
    return Path(os.path.expandvars(cache)).expanduser()


def local_repo_ids(cache_dir: Path | None = None) -> list[str]:
    """Ids of the model repos in the HF cache that have at least one snapshot (no network)."""
    root = cache_dir or hf_cache_dir()
    try:
        folders = list(root.glob("models--*"))
    except OSError:
        return []
    ids = []
    for folder in folders:
        snapshots = folder / "snapshots"
        if snapshots.is_dir() and any(snapshots.iterdir()):
            ids.append(folder.name.removeprefix("models--").replace("--", "/"))
    return sorted(ids)


def match_local_repo(query: str, repo_ids: list[str]) -> str | None:
    """The repo id ``query`` names: itself, or the one id containing it (case-insensitive).

    :returns: ``None`` when no id matches.
    :raises ModelLoadError: Several ids contain ``query`` (code ``ambiguous_model``); the
        message lists them.
    """
    wanted = query.lower()
    exact = [r for r in repo_ids if r.lower() == wanted]
    if exact:
        return exact[0]
    found = [r for r in repo_ids if wanted in r.lower()]
    if len(found) > 1:
        listing = "\n".join(f"  {r}" for r in found)
        raise ModelLoadError(f"{query!r} is ambiguous: it matches {len(found)} local models:\n{listing}\n"
                             "give more of the repo id", param="model", code="ambiguous_model")
    return found[0] if found else None
