"""Where a model's files are: a MODEL argument becomes a local folder (:class:`ModelSource`)
and its facts (:func:`read_model_info`), before :mod:`mlxrt.loading` loads the weights.

Sources: a local folder in Hugging Face layout, a ``.gguf`` file (converted once into a
cache folder), a Hugging Face repo id (resolved through the HF cache by huggingface-hub,
downloaded only when the caller allows it), or nothing — the embedded SmolLM2 model.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import attrs

from mlxrt.errors import ModelLoadError
from mlxrt.loading.paths import (
    MODEL_FILE_PATTERNS,
    hf_cache_dir,
    local_repo_ids,
    match_local_repo,
    mlxrt_home,
)
from mlxrt.records import ModelInfo

__all__ = ["ModelSource", "resolve_model", "read_model_info"]

log = logging.getLogger("mlxrt.loading.resolve")


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
        from mlxrt.loading.embedded import (
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
    from mlxrt.loading.gguf_library import find_gguf

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
    from mlxrt.loading.embedded import EMBEDDED_MODEL_ID, embedded_available

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
    from mlxrt.loading.downloads import download  # recorded, so GET /downloads shows it

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
    from mlxrt.loading.gguf import (
        CONVERTER_VERSION,
        UnsupportedGGUF,
        auto_float_dtype,
        convert_gguf,
    )
    from mlxrt.loading.gguf_quant import kernel_widths

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
    except (OSError, ValueError) as exc:  # not JSON, or not UTF-8
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


#: How much of a tokenizer.json :func:`_added_tokens` reads before it parses the whole file.
_ADDED_TOKENS_PREFIX = 4 << 20


def _added_tokens(path: Path) -> list[Any]:
    """``tokenizer.json``'s top-level ``added_tokens``, parsed from the file's head alone.

    Tokenizers write that list before the vocabulary and merges, which are most of the file
    (31 MB of Gemma 3's, where the whole parse took 0.38 s of the server's start, holding the
    GIL while the tokenizer's own loader waited for it). The top-level members are read in order
    up to ``added_tokens``, from a prefix that doubles up to :data:`_ADDED_TOKENS_PREFIX`; a file
    that puts it later, or that is not JSON, is parsed whole (and refused as before)."""
    decoder = json.JSONDecoder()
    size = 1 << 16
    try:
        with path.open("rb") as f:
            head = f.read(size)
            while True:
                whole = len(head) < size
                try:  # a character the prefix cuts in two waits for the next read
                    text = codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
                except UnicodeDecodeError:
                    found = None
                    break
                found = _member_before_the_rest(decoder, text, "added_tokens")
                if found is not None or whole:
                    break
                if size >= _ADDED_TOKENS_PREFIX:
                    found = None
                    break
                head += f.read(size)
                size *= 2
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if isinstance(found, list):
        return found
    tok = _read_json(path)
    listed = tok.get("added_tokens", []) if isinstance(tok, dict) else []
    return listed if isinstance(listed, list) else []


def _member_before_the_rest(decoder: json.JSONDecoder, text: str, name: str) -> Any:
    """The value of the top-level member ``name`` of the JSON object that ``text`` begins,
    read member by member; ``None`` if ``text`` ends (or stops being JSON) first."""
    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    try:
        i = skip(0)
        if text[i] != "{":
            return None
        i += 1
        while True:
            i = skip(i)
            key, i = decoder.raw_decode(text, i)
            i = skip(i)
            if text[i] != ":" or not isinstance(key, str):
                return None
            value, i = decoder.raw_decode(text, skip(i + 1))
            if key == name:
                return value
            i = skip(i)
            if text[i] != ",":
                return None
            i += 1
    except (ValueError, IndexError):  # JSONDecodeError is a ValueError: the prefix ended
        return None


def read_model_info(source: ModelSource) -> ModelInfo:
    """Read config, tokenizer facts and chat template of a model folder (no weights)."""
    config = _read_json(source.path / "config.json")
    if not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{source.path / 'config.json'} has no model_type")
    added = _added_tokens(source.path / "tokenizer.json")
    special = {t["content"]: t["id"] for t in added if isinstance(t, dict) and "content" in t}
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
