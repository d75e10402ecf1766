"""Where mlxrt keeps files: its own cache root, the Hugging Face hub cache, and which files of a
repo a model needs.

Its own module so that :mod:`mlxrt.loading` and the sources it calls (downloads, the embedded
model) share them without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MODEL_FILE_PATTERNS", "hf_cache_dir", "mlxrt_home"]

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
