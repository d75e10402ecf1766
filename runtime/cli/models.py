"""Model management commands: ``mlxrt get``, ``ls``, ``scan``, ``rm`` and ``fit``.

Everything works on the standard Hugging Face cache through huggingface-hub (``HF_HUB_CACHE``
or ``HF_HOME`` choose it); ``ls`` also lists the embedded default model. A MODEL argument is
what ``serve`` takes: a local folder, a ``.gguf`` file, a repo id of the cache or any part of
one that names a single repo, or the embedded model's id (``fit``'s default).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from mlxrt.engine.config import ENGINE_DEFAULTS
from mlxrt.loading.dtype_choice import DTYPES
from mlxrt.loading.library import parameter_size

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = ["register", "human_bytes"]


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def _fail(exc: Any) -> click.ClickException:
    return click.ClickException(getattr(exc, "message", str(exc)))


def register(cli: click.Group, host: PluginHost) -> None:
    """Add the model management commands to ``cli``; ``host`` answers the family hooks."""
    from mlxrt.errors import ModelLoadError

    @cli.command("get")
    @click.argument("repo")
    @click.option("--revision", default=None, help="Branch, tag or commit (default: main).")
    @click.option("--all-files", is_flag=True, help="Every file of the repo, not only what serving needs.")
    def get_cmd(repo: str, revision: str | None, all_files: bool) -> None:
        """Download REPO (ORG/NAME) into the Hugging Face cache, resuming a partial download."""
        from mlxrt.loading.downloads import download

        try:
            path = download(repo, revision=revision, all_files=all_files)
        except ModelLoadError as exc:
            raise _fail(exc) from None
        size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
        click.echo(f"{repo}: {human_bytes(size)} in {path}")

    @cli.command("ls")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
    def ls_cmd(as_json: bool) -> None:
        """List the models `mlxrt serve` can serve from here: the embedded default model
        (served when no MODEL is given), the Hugging Face cache, one row per repo, then the GGUF
        files of the HF cache, Ollama and LM Studio, one row each."""
        from mlxrt.loading.library import embedded_model, scan_library

        scan = scan_library(host)
        embedded = embedded_model(host)
        models = [*([embedded] if embedded is not None else []), *scan.models]
        if as_json:
            click.echo(json.dumps([m.describe() for m in models], indent=2))
            return
        if not models:
            click.echo(f"no models in {scan.root} — download one with `mlxrt get ORG/NAME`")
            return
        rows = [("REPO", "SIZE", "PARAMS", "BITS", "ARCH", "FAMILY", "TIER", "VISION")]
        for m in models:
            tier = m.support_tier if m.problem is None else "broken"
            name = {"embedded": f"{m.repo_id} (embedded: the default)", "ollama": f"{m.repo_id} (ollama)",
                    "lmstudio": f"{m.repo_id} (lm studio)"}.get(m.source, m.repo_id)
            rows.append((name, human_bytes(m.size_bytes), parameter_size(m.params) or "-",
                         str(m.quant_bits) if m.quant_bits else "-", m.model_type or "-", m.family or "-",
                         tier or "-", "yes" if m.vision else "no"))
        click.echo(_table(rows))

    @cli.command("scan")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
    def scan_cmd(as_json: bool) -> None:
        """Check every model of the Hugging Face cache and the GGUF stores (Ollama, LM Studio):
        servable, or why not."""
        from mlxrt.loading.library import scan_library

        scan = scan_library(host)
        if as_json:
            click.echo(json.dumps({"cache": str(scan.root), "models": [m.describe() for m in scan.models],
                                   "warnings": scan.warnings}, indent=2))
            return
        for m in scan.models:
            verdict = "ok" if m.servable else (m.problem or f"unsupported architecture {m.model_type}")
            click.echo(f"{m.repo_id}: {verdict}")
        for warning in scan.warnings:
            click.echo(f"warning: {warning}", err=True)
        total = sum(m.size_bytes for m in scan.models)
        ok = sum(m.servable for m in scan.models)
        click.echo(f"{len(scan.models)} repos ({ok} servable), {human_bytes(total)} in {scan.root}")

    @cli.command("rm")
    @click.argument("model")
    @click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
    def rm_cmd(model: str, yes: bool) -> None:
        """Delete MODEL (a repo id or a unique part of one) from the Hugging Face cache."""
        from mlxrt.loading.library import delete_repo, find_local, scan_library

        try:
            target = find_local(model, scan_library(None).models)
        except ModelLoadError as exc:
            raise _fail(exc) from None
        if target.source != "hf-cache":
            raise click.ClickException(f"{target.repo_id} is a GGUF of {target.source} ({target.path}): "
                                       "mlxrt rm deletes from the Hugging Face cache only")
        if not yes:
            click.confirm(f"delete {target.repo_id} ({human_bytes(target.size_bytes)}, "
                          f"{target.revisions} revision(s))?", abort=True)
        freed = delete_repo(target.repo_id)
        click.echo(f"deleted {target.repo_id} ({human_bytes(freed)} freed)")

    @cli.command("fit")
    @click.argument("model", required=False)
    @click.option("--ctx", type=click.IntRange(min=1), default=8192, show_default=True,
                  help="Tokens of context to assess.")
    @click.option("--memory-budget", default=None,
                  help="GB (10^9 bytes) the model may use in all, as for `serve`, or a size such as "
                  "24GB or 512MiB. Default: 75% of this machine's memory.")
    @click.option("--prompt-cache-bytes", default=None,
                  help="Prompt cache cap, as for `serve` (default: a quarter of what the weights leave).")
    @click.option("--batch", type=click.IntRange(min=1), default=ENGINE_DEFAULTS["batch"], show_default=True,
                  help="Rows decoded together, as for `serve` (each pays the fixed per-request state).")
    @click.option("--dtype", type=click.Choice(DTYPES), default="auto", show_default=True,
                  help="Assess the weights in the dtype `serve --dtype` would serve them in (auto: the stored "
                  "quantized weights where the mlxrt-qmv kernel computes them, else float32 on a CPU with a "
                  "fast BLAS when that fits the budget, else stored; docs/performance.md).")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
    def fit_cmd(model: str | None, ctx: int, memory_budget: str | None, prompt_cache_bytes: str | None, batch: int,
                dtype: str, as_json: bool) -> None:
        """Will MODEL serve CTX tokens of context within the memory budget, in the dtype `serve`
        would serve it in? MODEL is what `serve` takes (default: the embedded model `serve` serves
        when given none). Reads the config and the safetensors headers only; loads no weights."""
        from mlxrt.engine.memory import parse_size
        from mlxrt.loading.fit import assess
        from mlxrt.loading.resolve import resolve_model

        try:
            budget = parse_size(memory_budget, default_unit="GB") if memory_budget is not None else None
            cache = parse_size(prompt_cache_bytes) if prompt_cache_bytes is not None else None
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        try:
            source = resolve_model(model, allow_download=False, gguf_as_file=True)
            report = assess(source.path, ctx=ctx, budget=budget, prompt_cache_bytes=cache, rows=batch,
                            model=source.model_id, dtype=dtype)
        except ModelLoadError as exc:
            raise _fail(exc) from None
        if as_json:
            click.echo(json.dumps(report.describe(), indent=2))
            return
        click.echo(_fit_text(report.describe()))


def _fit_text(d: dict[str, Any]) -> str:
    budget = f"{human_bytes(d['budget_bytes'])}" + (" (75% of this machine)" if d["budget_source"] == "machine"
                                                    else "")
    lines = [
        f"model            {d['model']}",
        f"memory budget    {budget}",
        f"dtype            {d['dtype']['text']}",
        f"weights          {human_bytes(d['weight_bytes'])} ({parameter_size(d['params']) or '-'} parameters"
        + (f"; {human_bytes(d['stored_weight_bytes'])} as stored)" if d["dtype"]["cast"] else ")"),
        f"KV per token     {d['kv_bytes_per_token']} bytes ({d['kv_dtype']})",
        f"fixed per req.   {human_bytes(d['fixed_bytes_per_request'])} (sliding windows, recurrent state)",
        f"prompt cache     {human_bytes(d['prompt_cache_bytes'])}",
        f"KV at {d['ctx']:<10} {human_bytes(d['kv_bytes'])}",
        f"max safe context {d['max_safe_context']} tokens"
        + (f" (model window {d['context_window']})" if d["context_window"] else ""),
        f"fits             {'yes' if d['fits'] else 'no'}" + (f" — {d['reason']}" if d["reason"] else ""),
    ]
    return "\n".join(lines)
