"""GGUF models already on disk: where other tools keep them, and what each one is without loading it.

Three stores are searched (nothing is downloaded, no file is opened beyond its header):

* the Hugging Face cache: ``*.gguf`` files in a repo's canonical snapshot (a GGUF repo has no
  ``config.json``), named ``ORG/REPO/FILE.gguf``;
* Ollama's model store (``$OLLAMA_MODELS``, default ``~/.ollama/models``): each manifest
  ``manifests/HOST/NAMESPACE/NAME/TAG`` names its GGUF blob by digest (the layer whose
  ``mediaType`` is ``application/vnd.ollama.image.model``), kept as ``blobs/sha256-…``; named as
  ``ollama list`` names it: ``NAME:TAG`` (``library`` namespace of registry.ollama.ai),
  ``NAMESPACE/NAME:TAG``, or ``HOST/NAMESPACE/NAME:TAG`` for another registry (``hf.co/…``);
* LM Studio's models folder (``~/.lmstudio/models``, older ``~/.cache/lm-studio/models``):
  ``PUBLISHER/REPO/FILE.gguf``, named so; vision projectors (``mmproj-*``) are not models.

:func:`gguf_static` describes one file from its header alone, in the terms ``fit`` and the
library use for a folder: the config the converter would write, the bytes its weights take once
converted (:data:`mlxrt.loading.gguf_quant.LAYOUTS`), the parameter count.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import attrs

__all__ = ["GGUFEntry", "gguf_entries", "find_gguf", "gguf_static", "gguf_model", "OLLAMA_MODEL_MEDIA_TYPE"]

OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"


@attrs.frozen
class GGUFEntry:
    """One GGUF model on disk: its ``name`` in its store, the file, and the store (``source``:
    ``gguf-hf-cache``, ``ollama`` or ``lmstudio``)."""

    name: str
    path: Path
    source: str


def _ollama_root() -> Path:
    root = os.environ.get("OLLAMA_MODELS")
    return Path(root).expanduser() if root else Path.home() / ".ollama" / "models"


def _lmstudio_roots() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def _is_model_file(path: Path) -> bool:
    return path.suffix == ".gguf" and not path.name.lower().startswith("mmproj") and path.is_file()


def _ollama() -> list[GGUFEntry]:
    root = _ollama_root()
    manifests = root / "manifests"
    out = []
    for manifest in sorted(manifests.glob("*/*/*/*")) if manifests.is_dir() else []:
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue
        digest = next((layer.get("digest") for layer in layers
                       if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_MEDIA_TYPE), None)
        if not isinstance(digest, str) or ":" not in digest:
            continue
        blob = root / "blobs" / digest.replace(":", "-", 1)
        if not blob.is_file():
            continue
        host, namespace, name, tag = manifest.relative_to(manifests).parts
        # as `ollama list` names them: llama3.2:3b, user/model:tag, hf.co/user/repo:tag
        if host == "registry.ollama.ai":
            short = f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"
        else:
            short = f"{host}/{namespace}/{name}:{tag}"
        out.append(GGUFEntry(short, blob, "ollama"))
    return out


def _lmstudio() -> list[GGUFEntry]:
    out, seen = [], set()
    for root in _lmstudio_roots():
        for path in sorted(root.glob("*/*/*.gguf")) if root.is_dir() else []:
            name = "/".join(path.relative_to(root).parts)
            if _is_model_file(path) and name not in seen:
                seen.add(name)
                out.append(GGUFEntry(name, path, "lmstudio"))
    return out


def _hf_cache(cache_dir: Path | None = None) -> list[GGUFEntry]:
    from mlxrt.loading.paths import hf_cache_dir

    root = cache_dir or hf_cache_dir()
    out = []
    for repo in sorted(root.glob("models--*")) if root.is_dir() else []:
        snapshots = repo / "snapshots"
        ref = repo / "refs" / "main"
        try:
            snapshot = snapshots / ref.read_text().strip() if ref.is_file() else max(
                snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
        except (OSError, ValueError):
            continue
        if (snapshot / "config.json").is_file():
            continue  # an HF-format repo: the library lists it as such
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        for path in sorted(snapshot.rglob("*.gguf")):
            if _is_model_file(path):
                out.append(GGUFEntry(f"{repo_id}/{path.relative_to(snapshot).as_posix()}", path, "gguf-hf-cache"))
    return out


def gguf_entries(cache_dir: Path | None = None) -> list[GGUFEntry]:
    """Every GGUF model of the three stores (directory walks and manifests only)."""
    return [*_hf_cache(cache_dir), *_ollama(), *_lmstudio()]


def find_gguf(query: str) -> GGUFEntry | None:
    """The GGUF model ``query`` names: its exact name, else the one name containing it.

    :raises ModelLoadError: Several names contain it (code ``ambiguous_model``).
    """
    from mlxrt.loading.paths import match_local_repo

    entries = {e.name: e for e in gguf_entries()}
    name = match_local_repo(query, sorted(entries))
    return entries[name] if name is not None else None


def _read(path: Path) -> tuple[Any, Any]:
    """``(GGUFFile, ArchPlan)`` of ``path``, or :class:`~mlxrt.errors.ModelLoadError` saying why not."""
    from mlxrt.errors import ModelLoadError
    from mlxrt.loading.gguf_arch import plan_architecture
    from mlxrt.loading.gguf_format import UnsupportedGGUF, read_gguf
    from mlxrt.loading.gguf_quant import layout_of

    try:
        g = read_gguf(path)
        for name, t in g.tensors.items():
            layout_of(name, t.type)  # refuses an unknown type, naming the tensor
        return g, plan_architecture(g)
    except UnsupportedGGUF as exc:
        raise ModelLoadError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from exc
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


def gguf_static(path: Path) -> tuple[dict[str, Any], Any]:
    """``(config, WeightsSummary)`` of a GGUF file from its header: the config the converter
    writes (quantization block included) and its weights as converted for this machine.

    :raises ModelLoadError: An unreadable file, or an architecture or type the converter refuses.
    """
    return _static(*_read(path))


def _static(g: Any, plan: Any) -> tuple[dict[str, Any], Any]:
    import numpy as np

    from mlxrt.loading.gguf import auto_float_dtype
    from mlxrt.loading.gguf_arch import VISION_PREFIXES
    from mlxrt.loading.gguf_quant import GROUP_SIZE, kernel_widths, served_layout
    from mlxrt.loading.sizes import WeightsSummary

    kernel = kernel_widths()
    config = dict(plan.config)
    all_f32 = all(t.type == "F32" for t in g.tensors.values())
    float_dtype = "float32" if all_f32 else auto_float_dtype()
    float_bytes = 4 if float_dtype == "float32" else 2
    params = weight_bytes = 0
    bits: Counter[int] = Counter()
    for name, t in g.tensors.items():
        if name in plan.skipped and name.startswith(VISION_PREFIXES):
            continue  # the converter drops a vision tower
        layout = served_layout(t.type, kernel)
        n = int(np.prod(t.shape))
        params += n
        weight_bytes += int(n * layout.bytes_per_weight(float_bytes))
        if layout.bits:
            bits[layout.bits] += 1
    if bits:
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": bits.most_common(1)[0][0], "mode": "affine"}
    stored = f"quantized {'/'.join(map(str, sorted(bits)))}-bit" if bits else float_dtype
    return config, WeightsSummary(weight_bytes, 0, params, float_dtype, 1, stored)


def _model_info(g: Any, config: dict[str, Any], entry: GGUFEntry) -> Any:
    """What a family plugin is told about the GGUF (as it is told about a folder): the config,
    the control and user-defined tokens, the chat template."""
    from mlxrt.records import ModelInfo

    md = g.metadata
    tokens = md.get("tokenizer.ggml.tokens") or []
    types = md.get("tokenizer.ggml.token_type") or []
    special = {t: i for i, (t, ty) in enumerate(zip(tokens, types, strict=False)) if ty in (3, 4)}
    template = md.get("tokenizer.chat_template")
    return ModelInfo(model_id=entry.name, path=entry.path, model_type=config["model_type"], config=config,
                     special_tokens=special, chat_template=template if isinstance(template, str) else None,
                     source="gguf")


def gguf_model(entry: GGUFEntry) -> tuple[dict[str, Any], Any, Any]:
    """``entry`` from its header: the config the converter would write, its weights as converted
    for this machine (:class:`~mlxrt.loading.sizes.WeightsSummary`), and the
    :class:`~mlxrt.records.ModelInfo` a family plugin is told about it, as about a folder (the
    library describes it with them: :func:`mlxrt.loading.library.describe_gguf`).

    :raises ModelLoadError: An unreadable file, or an architecture or type the converter refuses.
    """
    g, plan = _read(entry.path)
    config, summary = _static(g, plan)
    return config, summary, _model_info(g, config, entry)
