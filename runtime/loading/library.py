"""The local model library: what the Hugging Face cache holds, one row per repo, then the GGUF
files of the HF cache, Ollama and LM Studio (:mod:`mlxrt.loading.gguf_library`), one row each.

huggingface-hub's ``scan_cache_dir`` walks the cache; each repo's canonical snapshot (its
``refs/main``, else the newest) is then described without loading anything: the config,
the safetensors headers (size, parameters, quantization), the family plugin that claims it
and its support tier. ``mlxrt ls``/``scan``/``rm`` and ``GET /library`` read these rows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.compat import mlx_lm_has_architecture
from mlxrt.errors import ModelLoadError
from mlxrt.loading import resolve_profile
from mlxrt.loading.paths import hf_cache_dir, match_local_repo
from mlxrt.loading.resolve import ModelSource, read_model_info

if TYPE_CHECKING:
    from mlxrt.loading.gguf_library import GGUFEntry
    from mlxrt.registry import PluginHost

__all__ = ["LocalModel", "scan_library", "embedded_model", "find_local", "support_tier", "delete_repo",
           "CacheScan", "describe_gguf", "parameter_size"]

log = logging.getLogger("mlxrt.loading.library")

#: Support tiers: a family plugin answers for the model; mlx-lm alone runs it (plain chat);
#: nothing installed can load it.
TIERS = ("family", "generic", "unsupported")


def parameter_size(n: int | None) -> str:
    """A parameter count as a model's size is spoken of (``135.0M``, ``1.5B``; ``""`` unknown):
    ``mlxrt ls``/``fit`` and Ollama's ``parameter_size`` say the same."""
    if not n:
        return ""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


@attrs.frozen
class LocalModel:
    """One repo of the HF cache, described from its canonical snapshot.

    ``problem`` says why it cannot be served (``servable`` is then false): no config, no
    weights, unreadable headers, an unfinished download.
    """

    repo_id: str
    revision: str | None
    path: Path | None
    size_bytes: int
    revisions: int
    model_type: str | None = None
    architecture: str | None = None
    params: int | None = None
    weight_bytes: int | None = None
    quant_bits: int | None = None
    quant_group_size: int | None = None
    family: str | None = None
    support_tier: str | None = None
    vision: bool = False
    incomplete_files: int = 0
    problem: str | None = None
    #: ``hf-cache``, ``embedded`` for the model ``mlxrt serve`` serves when given none, or a GGUF
    #: store: ``gguf-hf-cache``, ``ollama``, ``lmstudio`` (``path`` is then the GGUF file).
    source: str = "hf-cache"

    @property
    def servable(self) -> bool:
        return self.problem is None and self.support_tier in ("family", "generic")

    def describe(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["path"] = str(self.path) if self.path else None
        out["servable"] = self.servable
        return out


@attrs.frozen
class CacheScan:
    """The library plus what huggingface-hub could not read (``warnings``)."""

    root: Path
    models: list[LocalModel]
    warnings: list[str]


def support_tier(info: Any, host: PluginHost | None) -> tuple[str | None, str]:
    """``(family plugin or None, tier)`` for a model, from its files alone (nothing loads).

    The family is the first plugin that answers one of its family hooks; the tier is
    ``family`` then, else ``generic`` when mlx-lm has the architecture, else ``unsupported``.
    """
    family = None
    if host is not None:
        profile = resolve_profile(info, host)
        family = profile.family if profile.tier == "family" else None  # as the banner and /v1/models say
    if family:
        return family, "family"
    types = {info.model_type, info.text_model_type}
    return None, "generic" if any(mlx_lm_has_architecture(t) for t in types if t) else "unsupported"


def _quantization(config: dict[str, Any]) -> tuple[int | None, int | None]:
    for key in ("quantization", "quantization_config"):
        quant = config.get(key)
        if isinstance(quant, dict):
            bits, group = quant.get("bits"), quant.get("group_size")
            return (bits if isinstance(bits, int) else None), (group if isinstance(group, int) else None)
    return None, None


def describe_snapshot(repo_id: str, path: Path, host: PluginHost | None, **fields: Any) -> LocalModel:
    """Describe the model in ``path`` (config, headers, family); problems become ``problem``."""
    from mlxrt.loading.sizes import weights_summary

    row = LocalModel(repo_id=repo_id, path=path, **fields)
    try:
        info = read_model_info(ModelSource(path, repo_id, row.source))
    except ModelLoadError as exc:
        return attrs.evolve(row, problem=exc.message)
    config = dict(info.config)
    archs = config.get("architectures")
    bits, group = _quantization(config)
    vision = isinstance(config.get("vision_config"), dict) or (path / "optiq_vision.safetensors").is_file()
    row = attrs.evolve(row, model_type=info.model_type, quant_bits=bits, quant_group_size=group, vision=vision,
                       architecture=archs[0] if isinstance(archs, list) and archs else info.model_type)
    try:
        family, tier = support_tier(info, host)
    except Exception as exc:  # a plugin's hook raised: the row says so, the listing goes on
        family, tier = None, None
        row = attrs.evolve(row, problem=f"family hooks failed: {exc}")
    row = attrs.evolve(row, family=family, support_tier=tier)
    try:
        summary = weights_summary(path, config)
    except ModelLoadError as exc:
        return attrs.evolve(row, problem=row.problem or exc.message)
    row = attrs.evolve(row, params=summary.params, weight_bytes=summary.weight_bytes + summary.other_bytes)
    if row.incomplete_files:
        return attrs.evolve(row, problem=row.problem or f"unfinished download ({row.incomplete_files} partial "
                            f"files): resume it with `mlxrt get {repo_id}`")
    return row


def scan_library(host: PluginHost | None = None, cache_dir: Path | None = None) -> CacheScan:
    """Every model repo of the HF cache, one row per repo, by repo id, then every GGUF model of
    the HF cache, Ollama and LM Studio (no network)."""
    from mlxrt.loading.gguf_library import gguf_entries

    root = cache_dir or hf_cache_dir()
    scan = _scan_hf_cache(host, root)
    ggufs = [describe_gguf(e, host) for e in gguf_entries(cache_dir)]
    return CacheScan(root, [*scan.models, *ggufs], scan.warnings)


def describe_gguf(entry: GGUFEntry, host: PluginHost | None = None) -> LocalModel:
    """``entry`` as a library row, from its header (:func:`mlxrt.loading.gguf_library.gguf_model`);
    ``host`` answers the family hooks, as for a folder."""
    from mlxrt.loading.gguf_library import gguf_model

    try:
        size = entry.path.stat().st_size
    except OSError:
        size = 0
    row = LocalModel(repo_id=entry.name, revision=None, path=entry.path, size_bytes=size, revisions=1,
                     source=entry.source)
    try:
        config, summary, info = gguf_model(entry)
    except ModelLoadError as exc:
        return attrs.evolve(row, problem=exc.message, support_tier="unsupported")
    quant = config.get("quantization") or {}
    archs = config.get("architectures") or [config["model_type"]]
    row = attrs.evolve(row, model_type=config["model_type"], architecture=archs[0], params=summary.params,
                       weight_bytes=summary.weight_bytes, quant_bits=quant.get("bits"),
                       quant_group_size=quant.get("group_size"))
    try:
        family, tier = support_tier(info, host)
    except Exception as exc:  # a plugin's hook raised: the row says so, the listing goes on
        return attrs.evolve(row, problem=f"family hooks failed: {exc}")
    return attrs.evolve(row, family=family, support_tier=tier)


def _scan_hf_cache(host: PluginHost | None, root: Path) -> CacheScan:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return CacheScan(root, [], [])
    rows = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        revision = repo.refs.get("main") or max(repo.revisions, key=lambda r: r.last_modified, default=None)
        fields = {"size_bytes": repo.size_on_disk, "revisions": len(repo.revisions),
                  "incomplete_files": sum(1 for _ in (repo.repo_path / "blobs").glob("*.incomplete"))}
        if revision is None:
            rows.append(LocalModel(repo_id=repo.repo_id, revision=None, path=None,
                                   problem="no snapshot (nothing downloaded yet)", **fields))
            continue
        if not (revision.snapshot_path / "config.json").exists() and any(revision.snapshot_path.rglob("*.gguf")):
            continue  # a GGUF repo: each of its files is a row of its own

        rows.append(describe_snapshot(repo.repo_id, revision.snapshot_path, host,
                                      revision=revision.commit_hash, **fields))
    return CacheScan(root, rows, [str(w) for w in info.warnings])


def embedded_model(host: PluginHost | None = None) -> LocalModel | None:
    """The embedded default model (what ``mlxrt serve`` serves when given no MODEL) described as
    a library row, converted from its GGUF first if need be; ``None`` when it is not installed."""
    from mlxrt.loading.embedded import EMBEDDED_MODEL_ID, EmbeddedModelMissing, embedded_model_dir

    try:
        path = embedded_model_dir()
    except EmbeddedModelMissing:
        return None
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return describe_snapshot(EMBEDDED_MODEL_ID, path, host, revision=None, size_bytes=size, revisions=1,
                             source="embedded")


def find_local(query: str, models: Iterable[LocalModel]) -> LocalModel:
    """The local model ``query`` names (its repo id or a unique part of it).

    :raises ModelLoadError: Nothing matches (code ``model_not_found``) or several repos do
        (code ``ambiguous_model``, the message lists them).
    """
    by_id = {m.repo_id: m for m in models}
    repo = match_local_repo(query, sorted(by_id))
    if repo is None:
        raise ModelLoadError(f"no local model matching {query!r} — see `mlxrt ls`, or download it with "
                             "`mlxrt get ORG/NAME`", param="model", code="model_not_found")
    return by_id[repo]


def delete_repo(repo_id: str, cache_dir: Path | None = None) -> int:
    """Delete every revision of ``repo_id`` from the HF cache (huggingface-hub's own delete
    strategy, which removes the blobs no other revision uses); returns the bytes freed."""
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(cache_dir or hf_cache_dir())
    repo = next((r for r in info.repos if r.repo_id == repo_id and r.repo_type == "model"), None)
    if repo is None:
        raise ModelLoadError(f"{repo_id} is not in the Hugging Face cache", code="model_not_found")
    repo_path = repo.repo_path
    freed = 0
    if repo.revisions:
        # delete_revisions matches commit hashes in every repo it is given: give it this one only
        only = dataclasses.replace(info, repos=frozenset({repo}))
        strategy = only.delete_revisions(*(rev.commit_hash for rev in repo.revisions))
        freed = strategy.expected_freed_size
        strategy.execute()
    if repo_path.exists():  # no snapshot left, or only partial blobs: the folder goes too
        import shutil

        freed += sum(p.stat().st_size for p in repo_path.rglob("*") if p.is_file() and not p.is_symlink())
        shutil.rmtree(repo_path)
    return freed
