"""The ``mlxrt`` command line: ``serve``, ``plugins`` and whatever plugins register.

Plugins are loaded before the command line is built (they may add ``serve`` options and
subcommands), so ``--disable-plugin`` is read from argv first: a disabled plugin is never
imported, and a broken one is reported, not fatal.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import click

import mlxrt
from mlxrt.engine.config import ENGINE_DEFAULTS
from mlxrt.host import PluginHost, make_host
from mlxrt.loading.dtype_choice import DTYPES

if TYPE_CHECKING:
    from litestar import Litestar

    from mlxrt.model_pool import EngineFactory, ModelPool
    from mlxrt.records import ModelInfo
    from mlxrt.serving import ServingEngine

__all__ = ["main", "build_cli"]

log = logging.getLogger("mlxrt")



#: Read from argv by mlxrt.loading.blas.activate before click parses (the BLAS must load before
#: mlx.core is imported); declared so click accepts it before or after the command name.
_NO_SYSTEM_BLAS = click.option(
    "--no-system-blas", is_flag=True, expose_value=False,
    help="Keep the BLAS bundled with MLX instead of loading the system OpenBLAS or MKL "
    "(env MLXRT_NO_SYSTEM_BLAS=1; MLXRT_BLAS=openblas|mkl|bundled forces one).")


def _disabled_from_argv(argv: Sequence[str]) -> list[str]:
    names: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--disable-plugin" and i + 1 < len(argv):
            names.append(argv[i + 1])
        elif arg.startswith("--disable-plugin="):
            names.append(arg.split("=", 1)[1])
    return names


def _version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"mlxrt {mlxrt.__version__}"]
    for dist in ("mlx", "mlx-lm"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    from mlxrt.loading.blas import current

    parts.append(f"BLAS: {current()}")
    from mlxrt.engine import qmv

    parts.append(f"quantized kernel: {qmv.status().text}")
    return ", ".join(parts)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_text())
        ctx.exit()


def _plugins_table(host: PluginHost) -> str:
    rows = [("NAME", "VERSION", "KIND", "STATUS", "HOOKS / ERROR")]
    for r in host.records.values():
        detail = r.error if r.status == "failed" else ", ".join(h.removeprefix("mlxrt_") for h in r.hooks) or "-"
        rows.append((r.name, r.version or "-", r.kind, r.status, detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4] for row in rows
    )


def _model_report(host: PluginHost, model: str) -> dict[str, Any]:
    """Load ``model`` and say which family serves it and how its self-test went."""
    from mlxrt.errors import ModelLoadError, PluginError
    from mlxrt.loading import load_model
    from mlxrt.loading.resolve import read_model_info, resolve_model

    try:
        _loaded, profile = load_model(read_model_info(resolve_model(model, allow_download=False)), host)
    except (ModelLoadError, PluginError) as exc:
        raise click.ClickException(exc.message) from exc
    return {"id": profile.info.model_id, "family": profile.family, "tier": profile.tier,
            "self_test": dict(profile.self_test)}


def _defaulted(name: str) -> bool:
    """Whether the running command's option ``name`` kept its default (not given by the user)."""
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source in (None, click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP)


def _serve(host: PluginHost, model: str | None, opts: dict[str, Any]) -> None:
    from mlxrt.errors import ModelLoadError, PluginError

    for record in host.failed():
        click.echo(f"warning: plugin {record.name} failed to load and is skipped: {record.error}", err=True)
    if not opts.get("distributed"):
        from mlxrt.distributed.launch import launched_as_rank

        opts["distributed"] = launched_as_rank()  # under mlx.launch / mpirun, as mlx_lm.server
    if opts.get("pipeline") and not opts.get("distributed"):
        raise click.UsageError("--pipeline shards the model across ranks: it needs --distributed")
    if opts.get("distributed"):
        from mlxrt.distributed.serving import start

        if _defaulted("batch"):
            opts["batch"] = 1  # the distributed engine runs one request at a time (the default batches)
        _resume_gc()  # ranks other than 0 serve their shard inside start(), never reaching uvicorn
        try:
            start(host, model, opts)  # ranks other than 0 run their shard there and exit
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    # The port first: a busy one is said before the model loads, and before any "serving" line.
    listener = _listen(opts["host"], opts["port"])
    try:
        server = build_server(host, model, opts)
    except (ModelLoadError, PluginError) as exc:
        listener.close()
        raise click.ClickException(exc.message) from exc
    import uvicorn

    pool: ModelPool = server.state.models
    click.echo(_banner(pool, opts["host"], listener.getsockname()[1]), err=True)
    if (dtype := _served_engine(pool).loaded.dtype) is not None:
        log.info("dtype: %s", dtype)  # the choice and why, in full (the banner names the dtype only)
    if not _is_loopback(opts["host"]) and not opts.get("api_keys"):
        click.echo(
            f"WARNING: binding {opts['host']} (reachable from other machines) WITHOUT an API key: anyone "
            "who can reach this port can use the model. Pass --api-key KEY (or --api-key-file) to require one.",
            err=True,
        )
    try:
        # log_config=None: uvicorn's records go through mlxrt's handlers (request ids, JSON);
        # the access log is mlxrt's own (mlxrt.access), so uvicorn's is off.
        from mlxrt.api.connections import (
            DEFAULT_BODY_TIMEOUT,
            default_max_connections,
            guarded_protocol,
        )

        grace = opts.get("shutdown_grace")
        grace = 10.0 if grace is None else grace
        protocol = guarded_protocol(opts.get("max_connections") or default_max_connections(),
                                    opts.get("header_timeout") or 10.0,
                                    opts.get("body_timeout") or DEFAULT_BODY_TIMEOUT)
        # uvicorn cancels handlers still running after its own timeout (a text/plain 500 or a
        # cut stream): the engine ends running requests at `grace` with an error frame, and
        # uvicorn waits a little longer so that frame is written before it cancels anything.
        config = uvicorn.Config(server, host=opts["host"], port=opts["port"], log_level=opts["log_level"].lower(),
                                log_config=None, access_log=False, http=protocol,
                                timeout_graceful_shutdown=math.ceil(grace) + _FINAL_FRAME_SECONDS)
        _GracefulServer(config, pool, grace).run(sockets=[listener])
    finally:
        pool.stop()
    log.info("shut down cleanly")


def _listen(bind: str, port: int) -> Any:
    """The server's listening socket, bound before anything loads (uvicorn serves on it): a
    port in use ends the command at once with that error, before any "serving" line."""
    import socket

    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on accepted sockets whose
    # ``proto`` says TCP, and without it every kept-alive response whose body follows its head
    # in a second write (and every streamed chunk) waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart over TIME_WAIT
    try:
        sock.bind((bind, port))
    except OSError as exc:
        sock.close()
        raise click.ClickException(f"cannot listen on {bind}:{port}: {exc.strerror or exc}"
                                   + (" (another server runs there? pick another --port)"
                                      if exc.errno in (98, 48, 10048) else "")) from None
    sock.set_inheritable(True)
    return sock


def _served_engine(pool: ModelPool) -> ServingEngine:
    """The engine of the model served at start (loaded by :meth:`ModelPool.load_at_start`)."""
    current = pool.current()
    if current is None or current.engine is None or current.engine.loaded is None:
        raise RuntimeError("the server has no model loaded")  # load_at_start raised instead
    return current.engine


def _banner(pool: ModelPool, bind: str, port: int) -> str:
    """The start banner: what is served where on its first line, then one short line each for
    how (model, lane, dtype), the CPU path (BLAS, kernel) and which models requests may name.
    Why the dtype is what it is: ``GET /stats`` (``dtype.reason``) and the log."""
    from mlxrt.engine.qmv import status as qmv_status
    from mlxrt.loading.blas import current as current_blas

    engine = _served_engine(pool)
    dtype = engine.loaded.dtype if engine.loaded is not None else None
    draft = f", draft model {engine.speculator.info.model_id}" if engine.speculator is not None else ""
    settings = pool.settings
    names = ("only those named at start (--strict-model)" if settings.strict
             else "any local model loads on demand (--strict-model when exposed)")
    return "\n".join([
        f"mlxrt {mlxrt.__version__} serving {engine.info.model_id} on http://{bind}:{port}",
        f"  {engine.info.model_type}, family {engine.profile.family}, {engine.lane} lane{draft}"
        + (f"; dtype: {dtype.served} ({dtype.requested}; why: the log, GET /stats)" if dtype is not None else ""),
        f"  BLAS: {current_blas()}; quantized kernel: {qmv_status().text}",
        f"  models: up to {settings.max_models} resident; {names}"
        + ("; other names: the served model (x-mlxrt-model-fallback)" if settings.fallback else "; other names: 404"),
    ])


#: Seconds uvicorn waits past --shutdown-grace for the requests the engine ended to answer.
_FINAL_FRAME_SECONDS = 2


class _GracefulServer:
    """uvicorn's server, except that on SIGTERM/SIGINT the engine drains first (waiting
    requests get 503 at once, running ones get ``grace`` seconds, then an error frame) and a
    graceful shutdown ends the process with status 0 (uvicorn re-raises the signal after
    shutting down, which makes the exit status say "killed" to supervisors that treat that as
    a crash)."""

    def __new__(cls, config: Any, models: Any, grace: float) -> Any:
        import uvicorn

        from mlxrt.compat import forget_captured_signals

        class Server(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                _resume_gc()

            def handle_exit(self, sig: int, frame: Any) -> None:
                super().handle_exit(sig, frame)
                forget_captured_signals(self)

            async def shutdown(self, sockets: Any = None) -> None:
                # On the event loop, not in the signal handler: drain takes the engine's locks.
                models.drain(grace)
                await super().shutdown(sockets)

        return Server(config)


def _pause_gc() -> None:
    """Turn the cyclic garbage collector off while ``mlxrt serve`` starts.

    A start creates ~100,000 long-lived objects (modules, classes, the app's routes) and little
    cyclic garbage (~2,000 objects, ~0.5 MB: mostly the classes attrs builds twice for
    ``slots=True``); with the collector on, it traverses the growing heap again and again on the
    way (~10 % of the imports' CPU time, docs/performance.md "Start-up and memory").
    :func:`_resume_gc` turns it back on once the server listens."""
    gc.disable()


#: glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def _grow_heap_in_large_steps() -> None:
    """``mlxrt serve`` on glibc (Linux): the C heap grows 256 MiB at a time and keeps up to 1 GiB
    freed at its top instead of giving it back (``mallopt`` ``M_TOP_PAD``, ``M_TRIM_THRESHOLD``,
    and ``M_MMAP_THRESHOLD`` at its dynamic maximum, 32 MiB; elsewhere nothing changes).

    A start allocates some hundreds of MB in small pieces: Python's modules, and a large
    vocabulary's tokenizer in tokenizers' Rust (Gemma 3's 262,144 tokens and 514,847 merges,
    ~0.8 s of the start, all of it holding the GIL). With glibc's defaults the heap grows and is
    trimmed a little at a time; so, Gemma 3 270M's spawn to first completion was 1.69 s, 1.51 s
    with these (medians of 8 starts each, taking turns; quiet machine), for 45 MB more peak RSS
    (829 → 874 MB; SmolLM2's unchanged). Padding is address space until it is used.
    ``MLXRT_HEAP_STEPS=0`` leaves glibc's defaults (the A/B measurement's other side)."""
    import ctypes

    if os.environ.get("MLXRT_HEAP_STEPS", "1") == "0":
        return

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):  # not glibc (macOS, musl): its own malloc, left alone
        return
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mallopt(_M_TOP_PAD, 256 << 20)
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    # Setting either fixes the threshold past which an allocation is mapped on its own, which
    # glibc otherwise raises as such blocks are freed (up to 32 MiB): fixed at that, so that a
    # decode step's buffers of a few hundred KB are not mapped and unmapped every step.
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)


def _resume_gc() -> None:
    """After :func:`_pause_gc`: move everything the start made to the collector's permanent
    generation (``gc.freeze``, Python's recipe for long-lived start-up state: later collections
    no longer traverse it, and its small garbage is never freed) and turn the collector back on.
    Does nothing when the collector is on (``_pause_gc`` did not run: the server was built by
    other code)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _is_loopback(bind: str | None) -> bool:
    from mlxrt.api.edge import is_loopback

    return is_loopback(bind)


def _setup_logging(level: str, fmt: str) -> None:
    from mlxrt.api.observe import JsonFormatter, RequestIdFilter, TextFormatter

    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def build_server(host: PluginHost, model: str | None, opts: dict[str, Any]) -> Litestar:
    """Load the model, start the engine and build the app (also used by tests): its model pool
    is ``app.state.models``."""
    from mlxrt.api.app import create_app
    from mlxrt.engine import new_engine
    from mlxrt.engine.config import EngineConfig
    from mlxrt.loading import Loader
    from mlxrt.loading.resolve import resolve_model
    from mlxrt.serving import serve
    from mlxrt.templating import DEFAULT_CHAT_TEMPLATE

    host.options.update(opts)
    host.options.setdefault("started_at", time.time())
    source = resolve_model(model, allow_download=True)
    if opts.get("prompt_cache_bytes") is not None:
        from mlxrt.engine.memory import parse_size

        try:
            parse_size(opts["prompt_cache_bytes"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--prompt-cache-bytes") from None
    loader = Loader()

    def start_engine(host: PluginHost, info: ModelInfo, primary: bool) -> ServingEngine:
        config = EngineConfig.from_options(opts)
        # --adapter and --draft-model belong to the served model; the budget is shared.
        config = attrs.evolve(config, memory_budget=pool.settings.share,
                              **({} if primary else {"adapter": None, "draft_model": None}))
        if opts.get("distributed"):
            from mlxrt.distributed.serving import make_engine

            engine: ServingEngine = make_engine(host, config, opts, loader=loader)
        else:
            engine = new_engine(host, config, loader=loader)
        serve(host, engine)  # before the load: its hooks (mlxrt_vision) are given the model too
        engine.load(info)
        if opts.get("chat_template") and primary:
            from mlxrt.loading import with_replaced_template
            from mlxrt.text.named_templates import chat_template_text

            engine.tokenizer.chat_template = chat_template_text(opts["chat_template"], engine.tokenizer)
            engine.profile = with_replaced_template(engine.profile, engine.tokenizer)
        elif opts.get("use_default_chat_template") and getattr(engine.tokenizer, "chat_template", None) is None:
            engine.tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
        return engine

    pool = _model_pool(host, model, source, opts, start_engine)
    try:
        pool.load_at_start()
        return create_app(host, pool, cors_origins=_cors_origins(opts.get("allowed_origins")))
    except BaseException:
        pool.stop()
        raise


def _model_pool(host: PluginHost, model: str | None, source: Any, opts: dict[str, Any],
                start_engine: EngineFactory) -> ModelPool:
    """The models this server may answer with (``--max-models``, ``--model-alias``,
    ``--preload``, ``--strict-model``, ``--idle-unload``); see :mod:`mlxrt.model_pool`."""
    from mlxrt.engine.config import EngineConfig
    from mlxrt.loading.resolve import resolve_model
    from mlxrt.model_pool import ModelPool, PoolSettings

    specs = {model: str(source.path)} if model else {}
    aliases = {}
    for item in opts.get("model_alias") or ():
        name, sep, target = str(item).partition("=")
        if not sep or not name.strip() or not target.strip():
            raise click.BadParameter(f"{item!r} is not NAME=MODEL", param_hint="--model-alias")
        aliases[name.strip()] = resolve_model(target.strip(), allow_download=True)
        specs[target.strip()] = str(aliases[name.strip()].path)
    preload = []
    for item in opts.get("preload") or ():
        preload.append(resolve_model(item, allow_download=True))
        specs[item] = str(preload[-1].path)
    strict = opts.get("strict_model")
    if strict is None:
        # An exposed server must not load whatever path a request names, nor run the tokenizer
        # code of one with --trust-remote-code (docs/operators.md#several-models).
        strict = not _is_loopback(opts.get("host")) or bool(opts.get("trust_remote_code"))
    strict = bool(opts.get("distributed")) or strict
    settings = PoolSettings(
        max_models=max(int(opts.get("max_models") or 1), 1), idle_unload=opts.get("idle_unload"),
        strict=strict,
        # Unknown names get the served model, reported (header, log); a strict server answers 404
        # unless --model-fallback asks for the served model there too.
        fallback=not strict or bool(opts.get("model_fallback")),
        memory_budget=EngineConfig.from_options(opts).memory_budget)
    return ModelPool(host, source, settings, start_engine, aliases=aliases, preload=preload,
                     start_specs=specs, resolver=lambda name: resolve_model(name, allow_download=False))


def _cors_origins(given: str | None) -> list[str] | None:
    """CORS is off unless ``--allowed-origins`` lists origins (mlx_lm.server allows ``*``:
    any web page could then read a key-less server's answers)."""
    origins = [o.strip() for o in (given or "").split(",") if o.strip()]
    return origins or None


def build_cli(host: PluginHost) -> click.Group:
    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    # The text is built only when asked for: it imports the quantized kernel (and so mlx.core).
    @click.option("--version", is_flag=True, expose_value=False, is_eager=True, help="Show the version and exit.",
                  callback=_print_version)
    @_NO_SYSTEM_BLAS
    def cli() -> None:
        """mlxrt: a plugin-architecture model runtime and inference server built on MLX."""

    @cli.command("plugins")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
    @click.option("--disable-plugin", multiple=True, help="Do not load this plugin (repeatable).")
    @click.option("--model", "model", default=None,
                  help="Also load MODEL and show which family serves it and its capability self-test.")
    def plugins_cmd(as_json: bool, disable_plugin: tuple[str, ...], model: str | None) -> None:
        """List installed plugins: name, version, kind, hooks implemented, status."""
        import attrs

        # Collecting routes runs no server: a plugin whose mlxrt_routes raises shows failed here.
        host.collect_at_start("mlxrt_routes", host=host)
        records = [attrs.asdict(r) for r in host.records.values()]
        served = _model_report(host, model) if model else None
        if as_json:
            click.echo(json.dumps(records if served is None else {"plugins": records, "model": served}, indent=2))
            return
        click.echo(_plugins_table(host))
        if served is not None:
            click.echo(f"\nmodel {served['id']}: family {served['family']}, tier {served['tier']}")
            for capability, result in served["self_test"].items():
                click.echo(f"  self-test {capability}: {result}")

    serve_options = [opt for _plugin, opt in host.collect_at_start("mlxrt_serve_options")]

    @cli.command("serve", context_settings={"show_default": True})
    @click.argument("model_arg", metavar="[MODEL]", required=False)
    @click.option("--model", help="Model: a local HF folder, a .gguf file or a repo id "
                  "(default: the embedded SmolLM2-135M-Instruct).")
    @click.option("--host", default="127.0.0.1", help="Address to bind.")
    @click.option("--port", default=8080, type=int, help="Port to bind.")
    @click.option("--log-level", default="INFO",
                  type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False))
    @click.option("--allowed-origins", default=None,
                  help="CORS origins, comma-separated (* for any). Default: none (CORS off); listed origins "
                  "may also call state-changing routes without an API key.")
    @click.option("--allowed-hosts", multiple=True,
                  help="Host header names served (repeatable or comma list; * turns the check off). Default on "
                  "loopback: localhost, 127.0.0.1, ::1 and the bound address; elsewhere: not checked. "
                  "Other names get 421 (DNS-rebinding guard).")
    @click.option("--disable-plugin", multiple=True, help="Do not load this plugin (repeatable).")
    @click.option("--api-key", multiple=True, help="Require this API key on every API route "
                  "(Authorization: Bearer KEY or x-api-key: KEY); repeatable. /health stays open.")
    @click.option("--api-key-file", multiple=True, type=click.Path(dir_okay=False),
                  help="Read API keys from a file, one per line (# comments); repeatable.")
    @click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
                  help="Log lines as text or as one JSON object per line (with request_id).")
    @click.option("--max-body-size", default="32MiB", help="Largest request body accepted; larger gets 413.")
    @click.option("--max-connections", type=click.IntRange(min=1), default=None,
                  help="Open client connections at most; past it a new one closes the oldest idle one. "
                  "Default: 1024, or fewer under a lower open-file limit.")
    @click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
                  help="Seconds a new connection may take to send its request headers before it is closed.")
    @click.option("--body-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0,
                  help="Seconds a request's body may take to arrive after its headers; then 408 and the "
                  "connection is closed.")
    @click.option("--max-image-bytes", default="20MiB",
                  help="Largest image (encoded) a request may send or make the server fetch; larger gets 400.")
    @click.option("--image-fetch-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
                  help="Seconds the server may take to fetch one http(s) image URL.")
    @click.option("--allow-private-image-urls", is_flag=True,
                  help="Fetch image URLs on private/loopback addresses too (off: clients cannot make the "
                  "server probe its own network).")
    @click.option("--max-images", type=click.IntRange(min=0), default=16, show_default=True,
                  help="Images one request may carry; more gets 400.")
    @click.option("--max-image-pixels", type=click.IntRange(min=1), default=50_000_000, show_default=True,
                  help="Decoded pixels all images of one request may have together; more gets 400.")
    @click.option("--max-image-pixels-in-flight", type=click.IntRange(min=1), default=100_000_000,
                  show_default=True, help="Decoded pixels all requests together may hold at once (never below "
                  "--max-image-pixels); a request that finds no room waits up to 10 s, then gets 429.")
    @click.option("--shutdown-grace", type=click.FloatRange(min=0), default=10.0,
                  help="Seconds running requests get to finish on SIGTERM/SIGINT before they are cancelled.")
    @click.option("--temp", type=float, default=None,
                  help="Default temperature. Fallback chain: request → this flag → generation_config.json → 0.0")
    @click.option("--top-p", type=float, default=None, help="Default top_p (same chain; last fallback 1.0).")
    @click.option("--top-k", type=int, default=None, help="Default top_k (same chain; last fallback 0 = off).")
    @click.option("--min-p", type=float, default=None, help="Default min_p (same chain; last fallback 0.0).")
    @click.option("--max-tokens", type=int, default=None,
                  help="Default max_tokens (chat: 65536 capped by the context; completions: 512).")
    @click.option("--strict", is_flag=True,
                  help="Refuse request fields mlxrt does not read that would change the answer (400) instead of "
                  "listing them in x-mlxrt-ignored; hints such as prompt_cache_key or include: [] pass.")
    @click.option("--thinking/--no-thinking", default=None,
                  help="Default for models that can reason, when a request says nothing "
                  "(chat_template_kwargs.enable_thinking, then reasoning_effort, win). Default: the template's.")
    @click.option("--chat-template", default="",
                  help="Override the model's chat template: a built-in name (chatml, llama3, command-r, gemma, "
                       "mistral-v7, phi3, zephyr), a template file or Jinja text.")
    @click.option("--chat-template-args", default="{}", help="JSON object of default chat-template kwargs.")
    @click.option("--adapter", "--adapter-path", "adapter_path", default=None, type=click.Path(file_okay=False),
                  help="LoRA adapter folder (mlx-lm format) mounted at start, id = its folder name; the "
                       "default of requests that name no adapter.")
    @click.option("--adapter-dir", multiple=True, type=click.Path(file_okay=False),
                  help="Folder of adapter folders GET /v1/adapters/available lists and POST /v1/adapters may "
                       "mount from (repeatable); without one, adapters mount only at start.")
    @click.option("--draft-model", default=None,
                  help="A small model with the same tokenizer for speculative decoding (greedy output is "
                  "unchanged). Every request then runs in the serial lane, whatever --batch says.")
    @click.option("--num-draft-tokens", type=click.IntRange(min=0), default=ENGINE_DEFAULTS["num_draft_tokens"],
                  show_default=True,
                  help="Tokens the draft model proposes per step (a request's num_draft_tokens overrides it).")
    @click.option("--trust-remote-code", is_flag=True,
                  help="Allow the tokenizer's custom code from the model folder to run.")
    @click.option("--use-default-chat-template", is_flag=True,
                  help="Use a ChatML template when the model has none.")
    @click.option("--batch", "--decode-concurrency", "batch", type=click.IntRange(min=1),
                  default=ENGINE_DEFAULTS["batch"], show_default=True,
                  help="Requests decoded together (continuous batching; a lone request still decodes at the "
                  "serial lane's speed); 1 runs them one at a time. mlx_lm.server's --decode-concurrency.")
    @click.option("--prompt-concurrency", type=click.IntRange(min=1), default=ENGINE_DEFAULTS["prompt_concurrency"],
                  show_default=True,
                  help="Newcomers prefilled together in the batch lane.")
    @click.option("--prefill-step-size", type=click.IntRange(min=1), default=ENGINE_DEFAULTS["prefill_step_size"],
                  show_default=True,
                  help="Prompt tokens per prefill chunk (running streams decode between chunks).")
    @click.option("--prompt-cache-size", type=click.IntRange(min=0), default=ENGINE_DEFAULTS["prompt_cache_size"],
                  show_default=True,
                  help="Prompt (prefix KV) cache entries at most; 0 turns the cache off.")
    @click.option("--prompt-cache-bytes", default=None,
                  help="Prompt cache size cap, e.g. 2GB or 512MiB. Default: a quarter of what the "
                  "memory budget leaves after the weights, or 2 GiB without a budget.")
    @click.option("--prompt-cache-dir", default=None, type=click.Path(file_okay=False),
                  help="Also keep prompt-cache entries in this folder (safetensors), restored lazily after a "
                  "restart; entries are keyed by the model's fingerprint and the adapter set.")
    @click.option("--prompt-cache-dir-size", type=click.FloatRange(min=0),
                  default=ENGINE_DEFAULTS["prompt_cache_dir_size"], show_default=True,
                  help="GB (10^9 bytes) the --prompt-cache-dir folder may hold for this model; least "
                  "recently used entries are deleted past it.")
    @click.option("--memory-budget", type=click.FloatRange(min=0, min_open=True), default=None,
                  help="GB (10^9 bytes) the model may use in all: refuse to load a model that cannot "
                  "serve in it, cap each request's max_tokens to what fits beside its prompt (a prompt that cannot fit "
                  "is a 400), queue work that cannot fit yet.")
    @click.option("--max-queue", type=click.IntRange(min=0), default=ENGINE_DEFAULTS["max_queue"], show_default=True,
                  help="Requests that may wait for admission; past it, 429 with Retry-After.")
    @click.option("--request-timeout", type=click.FloatRange(min=0), default=ENGINE_DEFAULTS["request_timeout"],
                  show_default=True,
                  help="Seconds a request may take in all: waiting past it gets 429; generating past it, it "
                  "ends there with finish_reason length (x-mlxrt-finish: request_timeout). 0: no limit.")
    @click.option("--kv-quant", type=click.Choice(["off", "config", "4", "8"]), default=None,
                  help="Quantize the KV cache at 4 or 8 bits from the first token; off ignores the model's "
                       "kv_config.json (default: kv_config.json when the model has one). Quantized-KV "
                       "requests run in the serial lane.")
    @click.option("--kv-bits", type=click.Choice(["2", "3", "4", "5", "6", "8"]), default=None,
                  callback=lambda _c, _p, v: int(v) if v is not None else None,
                  help="mlx_lm.server's KV quantization: bits, from --quantized-kv-start tokens.")
    @click.option("--kv-group-size", type=click.Choice(["32", "64", "128"]),
                  default=str(ENGINE_DEFAULTS["kv_group_size"]), show_default=True,
                  callback=lambda _c, _p, v: int(v), help="Group size of quantized KV caches.")
    @click.option("--quantized-kv-start", type=click.IntRange(min=0), default=None,
                  help="Tokens after which --kv-bits quantizes the cache (default 5000, mlx_lm.server's).")
    @click.option("--distributed", is_flag=True,
                  help="Serve one model across the ranks of an mlx.distributed group (start every rank with "
                  "mlx.launch or `mlxrt launch`); rank 0 serves HTTP. docs/distributed.md")
    @click.option("--pipeline", is_flag=True,
                  help="With --distributed: pipeline parallel (layers split across ranks) instead of tensor "
                  "parallel.")
    @click.option("--distributed-backend", type=click.Choice(["any", "ring", "mpi", "jaccl", "nccl"]),
                  default="any", help="mlx.distributed backend to join.")
    @click.option("--distributed-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
                  help="Seconds a collective may take before the other ranks count as lost (then 503).")
    @click.option("--dtype", type=click.Choice(DTYPES), default="auto",
                  help="Cast the weights to this dtype at load, dequantizing a quantized checkpoint; stored keeps "
                  "the checkpoint's. auto: a quantized checkpoint stays quantized where the mlxrt-qmv kernel "
                  "computes it faster (the embedded SmolLM2: 4-bit, 115 MB), else float32 on a CPU with a fast "
                  "BLAS (system OpenBLAS or MKL) when it fits the memory budget, else stored (docs/performance.md).")
    @click.option("--max-models", type=click.IntRange(min=1), default=1,
                  help="Models resident at once; a request for another local model loads it, evicting the "
                  "least recently used idle one (docs/operators.md#several-models).")
    @click.option("--idle-unload", type=click.FloatRange(min=0, min_open=True), default=None,
                  help="Unload a model nobody used for this many seconds (default: never).")
    @click.option("--model-alias", multiple=True, metavar="NAME=MODEL",
                  help="Answer requests naming NAME with MODEL (a folder, .gguf or repo id), loaded on demand; "
                  "repeatable (e.g. Claude Code's model names).")
    @click.option("--preload", multiple=True, metavar="MODEL",
                  help="Also load MODEL at start (counts against --max-models); repeatable.")
    @click.option("--strict-model/--no-strict-model", default=None,
                  help="Serve only models named at start (MODEL, --preload, --model-alias): a request naming "
                  "another is 404, never loaded. Default: strict unless bound to loopback (and always with "
                  "--trust-remote-code).")
    @click.option("--model-fallback", is_flag=True,
                  help="On a strict server too, answer a request naming an unknown model with the served "
                  "model instead of 404. Without --strict-model this is the default: the response's model "
                  "and the x-mlxrt-model-fallback header say what answered and what was asked for.")
    @_NO_SYSTEM_BLAS
    def serve(model_arg: str | None, model: str | None, **opts: Any) -> None:
        """Serve MODEL over HTTP (OpenAI-compatible; a superset of mlx_lm.server)."""
        if model_arg and model and model_arg != model:
            raise click.UsageError("give the model once: as MODEL or as --model")
        _setup_logging(opts["log_level"], opts.pop("log_format"))
        from mlxrt.api.auth import read_keys
        from mlxrt.engine.memory import parse_size

        try:
            opts["api_keys"] = read_keys(opts.pop("api_key"), opts.pop("api_key_file"))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--api-key-file") from None
        from mlxrt.api.edge import parse_hosts

        opts["allowed_hosts"] = parse_hosts(opts["allowed_hosts"])
        try:
            opts["max_body_bytes"] = parse_size(opts.pop("max_body_size"))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--max-body-size") from None
        try:
            opts["max_image_bytes"] = parse_size(opts["max_image_bytes"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--max-image-bytes") from None
        try:
            args = json.loads(opts["chat_template_args"])
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--chat-template-args") from None
        if not isinstance(args, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--chat-template-args")
        opts["chat_template_args"] = args
        if opts.get("chat_template"):
            from mlxrt.text.named_templates import chat_template_text

            try:
                chat_template_text(opts["chat_template"])  # an unknown name fails now, not after loading
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--chat-template") from None
        _serve(host, model_arg or model, opts)

    serve.params.extend(serve_options)
    from mlxrt.cli.models import register as register_model_commands  # get, ls, scan, rm, fit

    register_model_commands(cli, host)
    from mlxrt.cli.chat import register as register_run  # run
    from mlxrt.cli.resident import register as register_resident  # ps, stop

    register_run(cli)
    register_resident(cli)
    from mlxrt.distributed.launch import register as register_launch

    register_launch(cli)
    for _plugin, _none in host.collect_at_start("mlxrt_register_commands", cli=cli):
        pass
    return cli


class _NoPyTorchNotice(logging.Filter):
    """Drops transformers' "PyTorch was not found…" notice, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


def _command_from_argv(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs (its first word that is not an option; the group's own options
    are flags)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _command_from_argv(argv) == "serve":
        from mlxrt.compat import defer_module, lean_mlx_lm

        # The server's start, before anything imports mlx-lm: its package __init__ imports
        # transformers (~1.4 s, docs/performance.md). Here, not at `import mlxrt`: it changes
        # sys.modules for the whole process.
        lean_mlx_lm()
        for name in ("yaml", "annotated_types", "pdb"):  # Litestar's, for what serving rarely does
            defer_module(name)
        _pause_gc()  # until the server listens (_resume_gc)
        _grow_heap_in_large_steps()
    from mlxrt.loading.blas import activate

    activate(argv)  # before any plugin or command can import mlx.core
    # mlxrt never runs PyTorch: transformers' notice that it is missing (printed when a batch lane,
    # a draft model or a non-MLX checkpoint imports it) is noise to a user, and only that is dropped.
    logging.getLogger("transformers").addFilter(_NoPyTorchNotice())
    if os.environ.get("MLXRT_LOG_PLUGINS") != "1":
        logging.getLogger("mlxrt.host").addHandler(logging.NullHandler())
        logging.getLogger("mlxrt.host").propagate = False
    host = make_host(disable=_disabled_from_argv(argv))
    build_cli(host).main(args=argv, prog_name="mlxrt")

