"""Hook specifications: the whole supported plugin API of mlxrt.

A plugin is a module (or object) registered under the ``mlxrt`` entry-point group whose
functions are marked with :data:`mlxrt.hookimpl` and named after a hook below::

    # pyproject.toml
    [project.entry-points.mlxrt]
    x = "mlxrt_family_x"

    # mlxrt_family_x/__init__.py
    from mlxrt import hookimpl

    @hookimpl
    def mlxrt_thinking_format(info):
        ...

Rules every hook follows:

* Hooks are called with **keyword arguments only**. An implementation may accept any subset
  of the documented arguments, so a hook can gain an argument without breaking plugins.
* **Call order**: third-party plugins run before built-ins (the host registers built-ins first
  and pluggy calls the last registered first). Use ``@hookimpl(tryfirst=True)`` only to
  override another third-party plugin.
* **Family hooks** (``firstresult``) run once per model load, on the engine thread, and their
  answers are frozen into a :class:`mlxrt.FamilyProfile`. No hook runs per token. A family
  answers for its own model types and returns ``None`` for all others, so a later plugin can
  override one aspect of a family without forking it. Hook wrappers are not supported on
  family hooks (the host walks the implementations itself to record which plugin answered).
* **Collection hooks** return lists (or mappings) that the host concatenates, tagging each
  contribution with the plugin that gave it.
* **Observer hooks** (``mlxrt_turn_finished``) watch work already done: every
  implementation runs, and one that raises is logged and skipped.
* An exception raised by a hook is reported as :class:`mlxrt.errors.PluginError` naming the
  plugin and the hook. At load time it fails the load with that message; per request it
  fails only that request.
* **The model is an argument.** ``host`` is the plugin registry (:class:`mlxrt.PluginHost`:
  ``host.options``, ``host.plugin_state``), the same for every model the server holds. A hook
  about one model (``mlxrt_vision`` and every per-request hook) is also given ``model``, a
  :class:`mlxrt.serving.ServedModel`: the model being loaded or asked (with ``--max-models``
  and ``--model-alias`` one process serves several; each hook call names its own). Key
  model-specific caches kept in plugin state by something of that model's, such as
  ``model.tokenizer``. Like every argument, ``model`` is passed only to implementations that
  name it: a plugin written before it existed keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from mlxrt.records import (
        ChatInput,
        FinishedTurn,
        GenerationRequest,
        LoadedModel,
        LogitsProcessor,
        ModelInfo,
        Sampler,
        ThinkingFormat,
        ToolParser,
        ToolPrompt,
        ToolStreamMode,
        VisionAdapter,
    )
    from mlxrt.registry import PluginHost
    from mlxrt.serving import ServedModel

__all__ = ["hookspec", "PROJECT"]

PROJECT = "mlxrt"
hookspec = pluggy.HookspecMarker(PROJECT)

# -- Family hooks: called at model load; a family answers for its own models ------------------


@hookspec(firstresult=True)
def mlxrt_load_model(info: ModelInfo, host: PluginHost) -> LoadedModel | None:
    """Load the model and tokenizer for ``info``.

    :param info: The model being loaded (folder, ``config.json``, tokenizer facts).
    :param host: The plugin host (options, other plugins).
    :returns: A :class:`mlxrt.LoadedModel`, or ``None`` to let a later plugin, and finally
        mlx-lm (``mlx_lm.load``), load it. Families whose architecture mlx-lm has return
        ``None``; a family with its own architecture returns
        ``mlxrt.loading.mlx_lm_load(info, classes=(Model, ModelArgs))``. A model that does not
        decode token by token returns ``LoadedModel(..., engine="denoising", denoiser=...)``
        (:class:`mlxrt.records.Denoiser`); the engine runs it on its serial lane.

    Called once per model load, on the engine thread. Stops at first non-None result.
    Import model code inside the implementation, not at module top level, so that
    ``mlxrt plugins`` stays fast.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def mlxrt_tool_parser(info: ModelInfo) -> ToolParser | None:
    """Give the parser for tool calls in this model's generated text.

    :param info: The loaded model's description.
    :returns: An object with ``start``, ``end`` and ``parse(text, tools)`` (see
        :class:`mlxrt.ToolParser`), or ``None`` if this plugin doesn't handle the model.
        A parser that also has ``opening(name)`` (:class:`mlxrt.records.ToolCallOpening`)
        lets ``tool_choice`` ``"required"`` / a named function be enforced (the engine
        applies the constraint itself, a family need not add a processor). Without it those
        choices are a 400. One that also has ``call_grammar(name, parameters, g)``
        (:class:`mlxrt.records.ToolCallGrammar`) has the whole call enforced by grammar,
        arguments valid under the tool's schema. When no plugin answers, the model is served without tool parsing
        (the generic tier: plain chat).

    Called once per model load, on the engine thread. Stops at first non-None result.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def mlxrt_tool_prompt(info: ModelInfo) -> ToolPrompt | None:
    """Give the way tools reach this model when its chat template renders none.

    At load mlxrt renders a probe tool through the model's template; when the tool does not
    appear in the prompt (the embedded SmolLM2's template, most generic-tier models'), tools
    would silently vanish, so mlxrt renders them itself with the :class:`mlxrt.ToolPrompt` this
    hook returns, or with its generic one (:class:`mlxrt.text.generic_tools.GenericToolPrompt`:
    the tools in a system message, calls as ``<tool_call>{"name": …, "arguments": …}</tool_call>``)
    when no plugin answers. The prompt's ``parser`` then reads the calls (it replaces any
    ``mlxrt_tool_parser`` answer: the model writes what the prompt asked for), and with the
    ``structured`` plugin ``tool_choice`` ``"auto"``, ``"required"`` and named are enforced by
    grammar (``auto_grammar``, the parser's ``call_grammar``).

    :param info: The loaded model's description.
    :returns: A :class:`mlxrt.ToolPrompt` (``render(messages, tools)`` → the conversation to
        template; ``parser``; optionally ``auto_grammar(tools, g)``), or ``None`` if this
        plugin has no tool prompt for the model. Not called for a model whose template renders
        tools.

    Called once per model load, on the engine thread. Stops at first non-None result.

    Example (a family whose models were tuned on a ``[CALL]{json}[/CALL]`` format)::

        @hookimpl
        def mlxrt_tool_prompt(info):
            return MyToolPrompt() if _ours(info) else None

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def mlxrt_tool_stream_mode(info: ModelInfo, has_tools: bool) -> ToolStreamMode | None:
    """Say how tool calls are found while streaming.

    :param info: The loaded model's description.
    :param has_tools: Whether the request carries tools. The host calls this hook twice at
        load, once with ``False`` and once with ``True``, and keeps both answers.
    :returns: A :class:`mlxrt.ToolStreamMode`, or ``None`` for the default:
        ``buffered-text`` when tools are present, ``plain`` otherwise.

    Called twice per model load, on the engine thread. Stops at first non-None result.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def mlxrt_thinking_format(info: ModelInfo) -> ThinkingFormat | None:
    """Describe how this model marks its reasoning.

    :param info: The loaded model's description.
    :returns: A :class:`mlxrt.ThinkingFormat`, or ``None`` if this plugin doesn't handle
        ``info.model_type``. When no plugin answers, the model has no reasoning format and its
        whole output is content.

    Called once per model load, on the engine thread. Stops at first non-None result.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def mlxrt_vision(info: ModelInfo, host: PluginHost, model: ServedModel) -> VisionAdapter | None:
    """Give the model's vision adapter, which turns images into spliced prompt embeddings.

    :param info: The loaded model's description.
    :param host: The plugin host.
    :param model: The model being loaded. Its weights are not there yet when the hook runs:
        keep ``model`` and read ``model.loaded.model`` when the tower first runs (it is the
        model this adapter serves, also when the server holds several).
    :returns: A :class:`mlxrt.VisionAdapter` whose ``splice(prompt_ids, images)`` runs per
        request, or ``None`` when the model has no vision input. The adapter should load its
        tower lazily, on the first image, so text-only sessions never pay for it.

    ``splice`` runs on the model's thread (:meth:`mlxrt.serving.ServedModel.render` hands it
    there) with the templated prompt ids (one placeholder where
    the template put each image) and the request's images as RGB ``PIL.Image.Image`` objects (EXIF
    orientation applied, :mod:`mlxrt.loading.images`); it returns a :class:`mlxrt.SplicedPrompt` (the
    expanded ids and the prompt's input embeddings) or raises
    :class:`~mlxrt.errors.InvalidRequest`. The engine then prefills from the embeddings,
    bypasses the prompt cache and runs the request in the serial lane.

    Called once per model load, on the engine thread. Stops at first non-None result.

    .. versionadded:: 0.1
    """


# -- Per-request hooks --------------------------------------------------------------------------


@hookspec(firstresult=True)
def mlxrt_chat_template_kwargs(
    info: ModelInfo, request: ChatInput, host: PluginHost, model: ServedModel
) -> Mapping[str, Any] | None:
    """Give extra keyword arguments for the chat template of one request.

    :param info: The asked model's description (``model.info``).
    :param request: The chat input (messages, tools, the client's ``chat_template_kwargs``,
        ``reasoning_effort``).
    :param host: The plugin host; ``host.options`` holds the server defaults
        (``--chat-template-args``, ``--thinking``). :func:`mlxrt.templating.thinking_switch`
        resolves a thinking switch through the whole chain.
    :param model: The model the request is rendered for (its ``tokenizer``, ``profile``).
    :returns: A mapping merged over the client's own ``chat_template_kwargs`` (the client's
        explicit keys win), or ``None``. Families use it to map ``reasoning_effort`` to their
        template's switch (``enable_thinking`` for Qwen3).

    Called per request before templating, off the event loop. Stops at first non-None result.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def mlxrt_prompt_canonicalize(
    request: GenerationRequest, dialect: str, host: PluginHost, model: ServedModel
) -> GenerationRequest | None:
    """Rewrite a request before the prompt-cache lookup (strip volatile noise).

    :param request: The request as the dialect built it.
    :param dialect: The dialect's name (``openai``, ``anthropic``, ``responses``).
    :param host: The plugin host (``host.options``).
    :param model: The model the request runs on; ``model.tokenizer`` decodes and re-encodes
        the prompt for a rewrite made on text.
    :returns: A replacement request, or ``None`` to leave it unchanged.

    Called per request, off the event loop. Stops at first non-None result.

    .. versionadded:: 0.1
    """


@hookspec
def mlxrt_prepare_request(request: GenerationRequest, info: ModelInfo, host: PluginHost,
                          model: ServedModel) -> None:
    """Do slow per-request preparation before the request queues (compile a grammar, say).

    :param request: The request as the dialect built it (after canonicalization).
    :param info: The asked model's description (``model.info``).
    :param host: The plugin host (``host.options``, ``host.plugin_state``).
    :param model: The model the request runs on (``model.tokenizer`` for a grammar).
    :returns: ``None``. Keep what you prepare in your own cache, keyed by the request's
        content, and pick it up in ``mlxrt_logits_processors``.

    Called per request, for every dialect, by the request pipeline
    (:meth:`mlxrt.serving.ServedModel.prepare`), on a worker thread: neither the event loop nor
    the engine thread waits for it. Raise
    :class:`mlxrt.errors.InvalidRequest` for a client error (a 400 before anything streams).

    .. versionadded:: 0.1
    """


@hookspec
def mlxrt_capabilities() -> Sequence[str] | None:
    """Declare what this plugin adds to every served model, by name.

    :returns: Capability names, or ``None``. Known: ``structured_outputs`` (the plugin enforces
        :attr:`mlxrt.records.GenerationRequest.structured` — JSON schemas, regexes, choices,
        forced tool-call grammars — in ``mlxrt_logits_processors``).

    Capabilities are declared, never guessed from which hooks a plugin implements: a plugin
    that implements ``mlxrt_prepare_request`` for other reasons does not make the server accept
    ``response_format``. Read them through ``model.capabilities``
    (:attr:`mlxrt.serving.ServedModel.capabilities`). Collected once per served model, when it
    starts serving (not per request); results are collected.

    .. versionadded:: 0.1
    """


@hookspec
def mlxrt_logits_processors(
    request: GenerationRequest, info: ModelInfo, host: PluginHost, model: ServedModel | None
) -> Sequence[LogitsProcessor]:
    """Contribute logits processors for one request.

    :param request: The request about to be admitted.
    :param info: The asked model's description (``model.info``).
    :param host: The plugin host (server options in ``host.options``).
    :param model: The model admitting the request (``model.tokenizer``); ``None`` only for an
        engine run without a served model (unit tests of the engine).
    :returns: A list of ``(tokens, logits) -> logits`` callables (mlx-lm's protocol), applied
        in plugin call order before sampling; an empty list when not interested. Build them once
        here; they run per token.

    Called per request at admission, on the engine thread. Results are concatenated. Raise
    :class:`mlxrt.errors.InvalidRequest` for a client error in a claimed field (a 400); any
    other exception fails the request as a plugin error.

    .. versionadded:: 0.1
    """
    return ()  # a specification: pluggy never calls it


@hookspec(firstresult=True)
def mlxrt_sampler(request: GenerationRequest, info: ModelInfo, host: PluginHost,
                  model: ServedModel | None) -> Sampler | None:
    """Replace the sampler for one request.

    :param request: The request about to be admitted.
    :param info: The asked model's description (``model.info``).
    :param host: The plugin host (server options in ``host.options``, e.g. a plugin's own
        ``mlxrt_serve_options`` values).
    :param model: The model admitting the request; ``None`` only for an engine run without a
        served model (unit tests of the engine).
    :returns: A ``(logprobs) -> tokens`` callable (mlx-lm's protocol), or ``None`` for the
        default, ``mlx_lm.sample_utils.make_sampler`` over the request's sampling settings (its
        top-p filter the mlxrt-qmv kernel's where that is loaded: the same tokens).

    Called per request at admission, on the engine thread. Stops at first non-None result.
    Raise :class:`mlxrt.errors.InvalidRequest` for a client error in a claimed field (a 400).

    .. versionadded:: 0.1
    """


@hookspec
def mlxrt_turn_finished(turn: FinishedTurn, host: PluginHost, model: ServedModel) -> None:
    """Observe a chat turn that was answered in full (memory capture, audit logs).

    :param turn: The conversation and the answer (:class:`mlxrt.FinishedTurn`).
    :param host: The plugin host (``host.options`` holds your ``mlxrt_serve_options`` values).
    :param model: The model that answered (``turn.model`` is its id); a plugin that asks a
        model for more work (the memory plugin's editor) asks this one.
    :returns: ``None``.

    Called once per chat-style request (OpenAI chat, Anthropic Messages, Responses), streamed
    or not, when the dialect has assembled the whole answer; a request the client abandoned or
    that failed is not reported. A plugin that keeps turns keeps each ``turn.caller``'s apart
    (the API key's digest) and keeps none whose ``turn.store`` is false (Responses'
    ``store: false``). Runs **off the event loop**, on the host's one observer thread, in the
    order turns finish (so a slow observer delays only the observers after it, never a
    request). An exception is logged with the plugin's name and never reaches the client,
    whose answer is already complete.

    .. versionadded:: 0.1
    """


# -- Build-time collection hooks ----------------------------------------------------------------


@hookspec
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    """Contribute HTTP routes: Litestar route handlers, controllers or routers.

    :param host: The plugin host; ``host.options`` is available to handlers through it. A
        handler that serves a model gets it from :func:`mlxrt.api.models.model_for` (the
        request's ``model`` name; ``None``: the served model).
    :returns: A list of Litestar ``ControllerRouterHandler`` objects. Tag a handler with
        ``opt={"dialect": "<name>"}`` so errors it raises render in that dialect's shape.
        The edge checks (``mlxrt.api.edge``) treat a POST/PUT/PATCH as a JSON route (415
        unless ``Content-Type`` is JSON; ``opt={"json_body": False}`` opts out) and every
        non-GET route but a dialect's POST as state-changing (refused from other origins on a
        key-less server; ``opt={"state_changing": False}`` opts out, ``True`` opts a GET in).

    Called once when the app is built, on the event loop's thread. Results are concatenated;
    a route whose path and method another plugin already claimed is reported and skipped. A
    plugin whose implementation raises is marked failed and the server starts without it
    (``MLXRT_STRICT_PLUGINS=1``: a start-up error).

    .. versionadded:: 0.1
    """
    return ()  # a specification: pluggy never calls it


@hookspec
def mlxrt_request_fields(dialect: str) -> Mapping[str, type] | None:
    """Claim extra request-body fields for a dialect.

    :param dialect: The dialect asking (``openai``, …).
    :returns: A mapping of field name → expected Python type, or →
        :class:`mlxrt.records.RequestField` (the type and a ``validate`` callable, run with the
        value while the request is planned, off the event loop and before any response
        starts: raise :class:`~mlxrt.errors.InvalidRequest` for a bad value, a 400 also for a
        streamed request). Claimed fields are type-checked by the dialect and passed on in
        ``GenerationRequest.extra``. Two plugins claiming one field is a load error.

    Called once per dialect when the app is built. Results are merged.

    .. versionadded:: 0.1
    """


@hookspec
def mlxrt_serve_options() -> Sequence[Any]:
    """Contribute ``mlxrt serve`` command-line options.

    :returns: A list of ``click.Option`` objects. Their values reach plugins as
        ``host.options["name"]``. Keep mlx_lm.server's flag names where they overlap.

    Called once when the CLI is built. Results are concatenated.

    .. versionadded:: 0.1
    """
    return ()  # a specification: pluggy never calls it


@hookspec
def mlxrt_register_commands(cli: Any) -> None:
    """Add subcommands to the ``mlxrt`` command line.

    :param cli: The ``click.Group`` of the ``mlxrt`` command; call ``cli.command()`` on it.

    Called once when the CLI is built.

    .. versionadded:: 0.1
    """


@hookspec
def mlxrt_startup(host: PluginHost, model: ServedModel) -> Any:
    """Run when the server starts, after the model loaded and before the first request.

    :param host: The plugin host.
    :param model: The served model (the one ``mlxrt serve MODEL`` names), loaded.
    :returns: ``None`` or an awaitable, which the server awaits.

    Called once in the app's lifespan, on the event loop. A plugin that raises here (or whose
    awaitable raises) is marked failed (``/stats``), its hooks stop running and its routes
    answer 503; the server starts without it (``MLXRT_STRICT_PLUGINS=1``: a start-up error).

    .. versionadded:: 0.1
    """


@hookspec
def mlxrt_shutdown(host: PluginHost, model: ServedModel | None) -> Any:
    """Run when the server stops: flush and close what the plugin holds.

    :param host: The plugin host; the models are still loaded (they unload after every
        plugin's shutdown).
    :param model: The served model, or ``None`` when it was unloaded (``--idle-unload``).
    :returns: ``None`` or an awaitable, which the server awaits.

    Called once in the app's lifespan, on the event loop, after the server stopped taking
    requests (under ``mlxrt serve``, once running requests have finished or were ended at
    ``--shutdown-grace``). Plugins shut down in hook call order (third-party ones before
    built-ins). A plugin that raises here (or whose awaitable raises) is logged and marked failed
    (``mlxrt plugins``, ``/stats``); the other plugins still shut down and the server still
    stops. Under ``MLXRT_STRICT_PLUGINS=1`` the error is raised out of the app's shutdown
    instead, and the plugins after it are not called.

    .. versionadded:: 0.1
    """
