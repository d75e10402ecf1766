"""Ollama's ``POST /api/pull``: a Hugging Face repo downloaded into the local cache with
mlxrt's own download code (:func:`mlxrt.loading.downloads.download`, what ``mlxrt get`` runs),
its progress streamed as Ollama's NDJSON status lines.

Names are Hugging Face repo ids (``ORG/NAME``, also as Ollama writes them: ``hf.co/ORG/NAME``,
``:latest``); mlxrt does not read Ollama's own library. Offline, or for an unknown repo, the
error says so (a line with ``error`` once the stream started, else a 500 body). A client that
leaves does not stop the download: it finishes in the cache (and resumes if cut short).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from mlxrt.api.framing import guarded
from mlxrt.api.wire import FieldRule, check_fields, parse_json_object
from mlxrt.errors import InvalidRequest, MlxrtError, ModelLoadError
from mlxrt.plugins.ollama.encode import error_line
from mlxrt.plugins.ollama.schemas import PULL, opt
from mlxrt.plugins.ollama.wire import NDJSON, ndjson, pool_name

__all__ = ["pull", "repo_id"]

_RULES = (FieldRule("model", (str,)), FieldRule("name", (str,)), FieldRule("stream", (bool,)),
          FieldRule("insecure", (bool,)))
#: Seconds between progress lines while bytes arrive.
_EVERY = 0.5


def repo_id(name: Any) -> str:
    """The Hugging Face repo an Ollama pull names."""
    repo = pool_name(name)
    if not repo:
        raise InvalidRequest("model is required", param="model")
    if ":" in repo or repo.count("/") != 1:
        raise InvalidRequest(f"cannot pull {name!r}: mlxrt pulls Hugging Face repos (ORG/NAME, e.g. "
                             "mlx-community/SmolLM2-135M-Instruct-8bit), not Ollama library names or tags",
                             param="model")
    return repo


def _progress(repo: str) -> dict[str, Any] | None:
    """The download's saved state (``mlxrt get`` and ``GET /downloads`` read the same file)."""
    from mlxrt.loading.downloads import downloads_dir

    try:
        state = json.loads((downloads_dir() / (repo.replace("/", "--") + ".json")).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _failed(exc: BaseException) -> MlxrtError:
    if isinstance(exc, MlxrtError):
        return exc
    return ModelLoadError(f"pull failed: {type(exc).__name__}: {exc}", code="download_failed")


async def _lines(repo: str, done: asyncio.Future[Any]) -> AsyncGenerator[bytes, None]:
    yield ndjson({"status": "pulling manifest"})
    last = None
    while not done.done():
        await asyncio.wait([done], timeout=_EVERY)
        state = _progress(repo)
        if state and state.get("total_bytes"):
            line = {"status": f"pulling {repo}", "digest": f"sha256:{repo}", "total": state["total_bytes"],
                    "completed": state.get("received_bytes", 0)}
            if line != last:
                last = line
                yield ndjson(line)
    if (exc := done.exception()) is not None:
        raise _failed(exc)
    for status in ("verifying sha256 digest", "writing manifest", "success"):
        yield ndjson({"status": status})


@post("/api/pull", status_code=200, opt=opt(PULL), summary="Pull a model (Ollama)", tags=["ollama"])
async def pull(request: Request[Any, Any, Any]) -> Response[Any]:
    from mlxrt.loading.downloads import download

    body = parse_json_object(await request.body())
    check_fields(body, _RULES)
    repo = repo_id(body.get("model", body.get("name")))
    done = asyncio.get_running_loop().run_in_executor(None, download, repo)
    if body.get("stream") is False:
        try:
            await done
        except Exception as exc:
            raise _failed(exc) from None
        return Response(content={"status": "success"}, status_code=200)
    return Stream(guarded(_lines(repo, done), error_line), media_type=NDJSON, status_code=200,
                  headers={"cache-control": "no-cache"})
