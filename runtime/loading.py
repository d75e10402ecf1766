"""Model sources and loading: a MODEL argument becomes a local folder, a ModelInfo, and a
loaded model with its FamilyProfile.

Sources: a local folder in Hugging Face layout, a ``.gguf`` file (converted once into a
cache folder), a Hugging Face repo id (resolved through the HF cache by huggingface-hub,
downloaded only when the caller allows it), or nothing — the embedded SmolLM2 model.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.errors import ModelLoadError
from mlxrt.records import FamilyProfile, LoadedModel, ModelInfo, ToolStreamMode
from mlxrt.sources.paths import MODEL_FILE_PATTERNS, hf_cache_dir, mlxrt_home

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = [
    "ModelSource",
    "resolve_model",
    "read_model_info",
    "load_model",
    "load_weights",
    "mlx_lm_load",
    "resolve_profile",
    "cast_weights",
    "local_repo_ids",
    "match_local_repo",
]

log = logging.getLogger("mlxrt.loading")

@attrs.frozen
class ModelSource:
    """Where a model's files are, and the id the server answers with."""

    path: Path
    model_id: str
    source: str


def resolve_model(spec: str | None, *, allow_download: bool = True, gguf_as_file: bool = False) -> ModelSource:
    """Turn a MODEL argument into a local folder.

    A ``spec`` that is no file names a repo of the local HF cache: its exact id, else the one
    id containing it (case-insensitive); several such ids are an error listing them. The
    embedded model's id names it when the cache has no such repo. A repo id matching nothing
    local is looked up (and downloaded, when allowed) by huggingface-hub.

    :param spec: A folder, a ``.gguf`` file, a repo id or part of a local one, or ``None`` for
        the embedded model.
    :param allow_download: Whether a repo id missing from the HF cache may be downloaded.
    :param gguf_as_file: A GGUF resolves to the file itself, not converted (``fit`` reads its header).
    :raises ModelLoadError: With a message saying what was tried and what to do.
    """
    if spec is None:
        from mlxrt.sources.embedded import (
            EMBEDDED_MODEL_ID,
            EmbeddedModelMissing,
            embedded_model_dir,
        )

        try:
            return ModelSource(embedded_model_dir(), EMBEDDED_MODEL_ID, "embedded")
        except EmbeddedModelMissing as exc:
            raise ModelLoadError(str(exc)) from exc
    path = _as_path(spec)
    if path is not None and path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return _gguf_source(path, path.stem, gguf_as_file)
    if path is not None and path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a folder but has no config.json (not a Hugging Face model folder)")
        return ModelSource(path.resolve(), path.resolve().name, "folder")
    if path is not None and path.exists():
        raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file")
    repo = match_local_repo(spec, local_repo_ids())
    if repo is not None:
        if repo != spec:
            log.info("model %r is the local repo %s", spec, repo)
        return ModelSource(_from_hf_cache(repo, allow_download), repo, "hf-cache")
    from mlxrt.sources.gguf_library import find_gguf

    entry = find_gguf(spec)  # a GGUF in the HF cache, Ollama's store or LM Studio's folder
    if entry is not None:
        log.info("model %r is the %s GGUF %s", spec, entry.source, entry.path)
        return _gguf_source(entry.path, entry.name, gguf_as_file)
    if _names_embedded(spec):  # its exact id, not a part: short names stay clients' placeholders
        return resolve_model(None)
    if spec.count("/") != 1 or spec.startswith(("/", ".", "~")):
        raise ModelLoadError(f"model {spec!r} not found: not a local folder, a .gguf file, a Hugging Face repo id "
                             "or part of the id of a model in the local Hugging Face cache (see `mlxrt ls`)")
    return ModelSource(_from_hf_cache(spec, allow_download), spec, "hf-cache")


def _names_embedded(spec: str) -> bool:
    """Whether ``spec`` is the embedded model's id and that model is installed."""
    from mlxrt.sources.embedded import EMBEDDED_MODEL_ID, embedded_available

    return spec.lower() == EMBEDDED_MODEL_ID.lower() and embedded_available()


def _as_path(spec: str) -> Path | None:
    """``spec`` as a path to look at, or ``None`` when it cannot be one (a NUL byte, a name
    longer than the filesystem allows): such a name never reaches a filesystem call."""
    try:
        path = Path(spec).expanduser()
        path.exists()  # raises for what the OS cannot look up (ENAMETOOLONG, NUL)
    except (OSError, ValueError, RuntimeError):  # RuntimeError: ~user of no such user
        return None
    return path


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


def _from_hf_cache(repo_id: str, allow_download: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    patterns = MODEL_FILE_PATTERNS
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True,
                                      cache_dir=hf_cache_dir()))
    except HFValidationError as exc:
        raise ModelLoadError(f"{repo_id!r} is not a valid Hugging Face repo id: {exc}") from exc
    except LocalEntryNotFoundError:
        if not allow_download:
            raise ModelLoadError(
                f"model {repo_id!r} is not in the Hugging Face cache and downloads are off"
            ) from None
    from mlxrt.sources.downloads import download  # recorded, so GET /downloads shows it

    try:
        return download(repo_id)
    except ModelLoadError as exc:  # network, auth, missing repo: all reported the same way
        raise ModelLoadError(
            f"model {repo_id!r} is not in the local Hugging Face cache and could not be downloaded "
            f"({exc.message}). Download it on a connected machine with `mlxrt get {repo_id}`, or pass "
            "a local folder or .gguf file."
        ) from exc


def _gguf_source(path: Path, name: str, as_file: bool) -> ModelSource:
    return ModelSource(path if as_file else _convert_gguf_cached(path, name), name, "gguf")


def _convert_gguf_cached(gguf: Path, name: str | None = None) -> Path:
    from mlxrt.sources.gguf import (
        CONVERTER_VERSION,
        UnsupportedGGUF,
        auto_float_dtype,
        convert_gguf,
    )
    from mlxrt.sources.gguf_quant import kernel_widths

    stat = gguf.stat()
    # what the conversion depends on beyond the file: the float dtype and the kernel's widths
    source = (f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{CONVERTER_VERSION}:{auto_float_dtype()}:"
              f"{kernel_widths()}")
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    label = "".join(c if c.isalnum() or c in "-_." else "-" for c in (name or gguf.stem))[-80:]
    out = mlxrt_home() / "models" / f"{label}-{key}"
    if (out / "config.json").is_file():
        return out
    log.info("converting %s into %s (once)", gguf, out)
    try:
        return convert_gguf(gguf, out)
    except UnsupportedGGUF as exc:
        raise ModelLoadError(str(exc)) from exc


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


def read_model_info(source: ModelSource) -> ModelInfo:
    """Read config, tokenizer facts and chat template of a model folder (no weights)."""
    config = _read_json(source.path / "config.json")
    if not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{source.path / 'config.json'} has no model_type")
    tok = _read_json(source.path / "tokenizer.json")
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", []) if "content" in t}
    tok_config = _read_json(source.path / "tokenizer_config.json")
    template = tok_config.get("chat_template")
    jinja = source.path / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return ModelInfo(
        model_id=source.model_id,
        path=source.path,
        model_type=config["model_type"],
        config=config,
        special_tokens=special,
        chat_template=template if isinstance(template, str) else None,
        source=source.source,
        generation_config=_read_json(source.path / "generation_config.json"),
    )


def mlx_lm_load(info: ModelInfo, classes: tuple[type, type] | None = None, *,
                trust_remote_code: bool = False, lazy: bool = False) -> LoadedModel:
    """Load ``info`` with mlx-lm; ``classes=(Model, ModelArgs)`` supplies an architecture
    mlx-lm lacks (the family's own model code). ``trust_remote_code`` lets the tokenizer's
    own code from the model folder run (``--trust-remote-code``). ``lazy`` leaves the weights
    unread until evaluated (``--distributed``: each rank reads only its shard)."""
    from concurrent.futures import ThreadPoolExecutor

    from mlxrt.sources.weights import eos_token_ids, load_architecture_and_weights
    from mlxrt.text.tokenizer import load_tokenizer

    # The tokenizer loads on a thread of its own while the weights are read: both are mostly native
    # code that releases the GIL (~0.2 s of the embedded SmolLM2's start).
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="mlxrt-tokenizer") as pool:
            tokenizing = pool.submit(load_tokenizer, info.path, eos_token_ids=eos_token_ids(info.path),
                                     trust_remote_code=trust_remote_code)
            model, _config = load_architecture_and_weights(info.path, classes=classes, lazy=lazy)
            tokenizer = tokenizing.result()
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise ModelLoadError(f"mlx-lm could not load {info.model_id}: {exc}") from exc
    return LoadedModel(model=model, tokenizer=tokenizer)


def cast_weights(model: Any, dtype: str, *, model_id: str = "model") -> None:
    """``--dtype``: dequantize ``model``'s quantized layers, then cast every floating weight
    to ``dtype`` (``float32``, ``bfloat16`` or ``float16``), in place.

    On a Linux CPU with a fast BLAS (system OpenBLAS or MKL), float32 is the fast path: only
    fp32 matmuls go through BLAS (docs/performance.md); ``--dtype auto`` picks it there.

    :raises ModelLoadError: A quantized layer mlx-lm cannot dequantize is left.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    def quantized_layers() -> list[str]:
        return sorted({name.rsplit(".", 1)[0] for name, _ in tree_flatten(model.parameters())
                       if name.endswith(".scales")})

    if quantized_layers():  # mlxrt's copy of mlx-lm's, without mlx_lm.utils (transformers)
        from mlxrt.sources.weights import dequantize_model

        dequantize_model(model)
    left = quantized_layers()
    if left:
        raise ModelLoadError(f"--dtype {dtype}: cannot dequantize {model_id}: quantized layers "
                             f"{', '.join(left[:3])}{' …' if len(left) > 3 else ''} are of a kind mlx-lm "
                             "cannot dequantize; serve it without --dtype")
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    log.info("weights of %s cast to %s", model_id, dtype)


def resolve_profile(info: ModelInfo, host: PluginHost, model: object = None) -> FamilyProfile:
    """Ask every family hook once and freeze the answers, with who gave each (``model``: the
    served model being loaded, given to ``mlxrt_vision``)."""
    provenance: dict[str, str] = {}

    def ask(aspect: str, hook: str, **kwargs: Any) -> Any:
        plugin, value = host.first_answer(hook, **kwargs)
        if plugin is not None:
            provenance[aspect] = plugin
        return value

    thinking = ask("thinking_format", "mlxrt_thinking_format", info=info)
    parser = ask("tool_parser", "mlxrt_tool_parser", info=info)
    plain = ask("tool_stream_mode", "mlxrt_tool_stream_mode", info=info, has_tools=False)
    with_tools = ask("tool_stream_mode_with_tools", "mlxrt_tool_stream_mode", info=info, has_tools=True)
    vision = ask("vision", "mlxrt_vision", info=info, host=host, model=model)
    return FamilyProfile(
        info=info,
        thinking_format=thinking,
        tool_parser=parser,
        tool_stream_mode=ToolStreamMode(plain) if plain else ToolStreamMode.PLAIN,
        tool_stream_mode_with_tools=ToolStreamMode(with_tools) if with_tools else ToolStreamMode.BUFFERED_TEXT,
        vision=vision,
        provenance=provenance,
    )


def with_tool_prompt(profile: FamilyProfile, tokenizer: Any, host: PluginHost) -> FamilyProfile:
    """``profile`` with a :class:`~mlxrt.records.ToolPrompt` when the model's chat template
    renders no tools (``mlxrt_tool_prompt``, else mlxrt's generic one unless a family gave its
    own parser): its parser reads the calls and buffers them while streaming."""
    from mlxrt.text.generic_tools import GenericToolPrompt, template_renders_tools

    if template_renders_tools(tokenizer):
        return profile
    plugin, prompt = host.first_answer("mlxrt_tool_prompt", info=profile.info)
    if prompt is None:
        if profile.tool_parser is not None:  # the family reads its model's calls its own way
            return profile
        prompt, plugin = GenericToolPrompt(), None
    with_tools = profile.tool_stream_mode_with_tools
    if with_tools is ToolStreamMode.PLAIN:
        with_tools = ToolStreamMode.BUFFERED_TEXT
    # mlxrt's own prompt is no family's answer: the model stays in its tier and family
    provenance = {**profile.provenance, "tool_prompt": plugin or "default"}
    if plugin is not None:
        provenance["tool_parser"] = plugin
    return attrs.evolve(profile, tool_prompt=prompt, tool_parser=prompt.parser, tool_stream_mode_with_tools=with_tools,
                        provenance=provenance)


def with_replaced_template(profile: FamilyProfile, tokenizer: Any) -> FamilyProfile:
    """``profile`` once ``--chat-template`` replaced the model's template: a template that renders
    tools itself renders them, in place of the tool prompt :func:`with_tool_prompt` gave a model
    whose own template rendered none (its parser still reads the calls: mlxrt's generic one
    reads the common ``<tool_call>`` JSON markup)."""
    from mlxrt.text.generic_tools import template_renders_tools

    if profile.tool_prompt is None or not template_renders_tools(tokenizer):
        return profile
    return attrs.evolve(profile, tool_prompt=None)


def load_weights(info: ModelInfo, host: PluginHost) -> tuple[LoadedModel, str | None]:
    """The model and tokenizer through the family hooks (mlx-lm when none answers), cast as
    ``--dtype`` says (default ``auto``, :mod:`mlxrt.sources.dtype_choice`); with the name of the plugin
    that loaded it (``None``: mlx-lm). The folder is checked first
    (:func:`mlxrt.sources.folder_check.check_model_folder`: weights present, their dtypes,
    finite norms and scales; once loaded, a vocabulary that covers the tokenizer)."""
    from mlxrt.sources.folder_check import check_model_folder, check_vocabulary

    check_model_folder(info.path)
    plugin, loaded = host.first_answer("mlxrt_load_model", info=info, host=host)
    lazy = bool(host.options.get("distributed"))
    if loaded is None:
        loaded = mlx_lm_load(info, trust_remote_code=bool(host.options.get("trust_remote_code")), lazy=lazy)
    check_vocabulary(info.path, loaded.tokenizer)
    choice = _choose_dtype(loaded, info, host, lazy=lazy)
    if choice is not None and choice.cast:
        cast_weights(loaded.model, choice.cast, model_id=info.model_id)
    if choice is not None and not lazy:
        from mlxrt.engine import qmv

        if not choice.cast and (count := qmv.install(loaded.model)):
            log.info("%d quantized layers of %s run on the %s", count, info.model_id, qmv.status().text)
        if (count := qmv.install_fused(loaded.model)):
            log.info("%d norm and rotary layers of %s (and its attention and gated activation) run on "
                     "the %s fused primitives", count, info.model_id, qmv.status().text)
    return attrs.evolve(loaded, dtype=choice), plugin


def _choose_dtype(loaded: LoadedModel, info: ModelInfo, host: PluginHost, *, lazy: bool) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    from mlxrt.blas import current
    from mlxrt.engine import qmv
    from mlxrt.engine.memory import parse_size
    from mlxrt.sources.dtype_choice import blas_name, choose_dtype

    if not isinstance(loaded.model, nn.Module):  # a plugin's own model object: nothing to cast
        return None
    budget = host.options.get("memory_budget")
    blas = current()
    return choose_dtype(host.options.get("dtype") or "auto", loaded.model, info,
                        budget=parse_size(budget, default_unit="GB") if budget is not None else None,
                        blas_fast=blas.fast, blas_name=blas_name(blas.kind),
                        on_cpu=mx.default_device() == mx.cpu, lazy=lazy,
                        models=int(host.options.get("max_models") or 1), kernel=qmv.status().module)


def load_model(info: ModelInfo, host: PluginHost, model: object = None) -> tuple[LoadedModel, FamilyProfile]:
    """Load the model through the family hooks (mlx-lm when none answers) and resolve its
    profile (``model``: the served model being loaded, for the hooks that are given it)."""
    loaded, plugin = load_weights(info, host)
    profile = resolve_profile(info, host, model)
    profile = attrs.evolve(profile, provenance={"load_model": plugin or "mlx-lm", **profile.provenance})
    profile = with_tool_prompt(profile, loaded.tokenizer, host)
    from mlxrt.sources.self_test import run_self_test

    return loaded, attrs.evolve(profile, self_test=run_self_test(profile, loaded.tokenizer))


