"""The served model: the one typed seam between a loaded model and everything that asks it for work.

A dialect route, a plugin's own route, a background job (the memory plugin's editor) and the
status pages all see a model as a :class:`ServedModel` — what :func:`mlxrt.api.models.model_for`
(routes) and :class:`mlxrt.model_pool.ModelPool` hand out, and what every hook about one model is
given as its ``model`` argument — never the engine behind it:

- facts frozen at load: :attr:`~ServedModel.info`, :attr:`~ServedModel.profile`,
  :attr:`~ServedModel.tokenizer`, :attr:`~ServedModel.context_ceiling`,
  :attr:`~ServedModel.capabilities` (the plugins' ``mlxrt_capabilities``, collected once);
- verbs: :meth:`~ServedModel.render` a chat (its images spliced in here, on the model's thread), :meth:`~ServedModel.plan` a
  generation (the only builder of a :class:`~mlxrt.records.GenerationRequest`: ``--max-tokens``
  and admission, the sampling chain, logit-bias checks, ``tool_choice`` enforcement, adapters,
  ``mlxrt_prompt_canonicalize``), :meth:`~ServedModel.prepare` it (``mlxrt_prepare_request``),
  :meth:`~ServedModel.generate`, :meth:`~ServedModel.complete` (for in-process callers: the
  finished answer), :meth:`~ServedModel.count_tokens`, and :meth:`~ServedModel.call` to run a
  function on the model's thread.

:class:`EngineModel` is the implementation over one engine (:func:`serve` makes it and tells the
engine, whose own hooks — the vision adapter at load, samplers and processors at admission —
are then given it too); the HTTP pipeline (:mod:`mlxrt.api.pipeline`) adds only the wire:
decoding, the client's connection, framing.

Imports run one way: this module depends on the registry (:mod:`mlxrt.registry`), templating
and the engine's types; the registry and the engine never import it (the engine holds its
served model as an opaque ``served_model`` it hands to hooks).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from mlxrt.capabilities import capabilities_of, declared
from mlxrt.errors import InvalidRequest
from mlxrt.records import (
    Capabilities,
    ChatInput,
    EngineKind,
    FamilyProfile,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    LoadedModel,
    ModelInfo,
    RequestOptions,
    StructuredOutput,
    ToolCall,
)
from mlxrt.templating import RenderedPrompt

if TYPE_CHECKING:
    from mlxrt.engine.adapters import AdapterRegistry
    from mlxrt.engine.bridge import Generation
    from mlxrt.engine.config import EngineConfig
    from mlxrt.engine.memory import MemoryPlan
    from mlxrt.engine.speculative import Speculator
    from mlxrt.metrics import Histogram
    from mlxrt.registry import PluginHost

__all__ = ["ServingEngine", "ServedModel", "EngineModel", "Completion", "serve", "choice_requests",
           "forced_tool_call", "forced_openings"]


@attrs.frozen
class Completion:
    """A finished answer for an in-process caller (:meth:`ServedModel.complete`).

    :ivar content: The answer's text (reasoning split off).
    :ivar reasoning: The reasoning text, if the model reasoned.
    :ivar calls: The tool calls the family's parser read back.
    :ivar reason: Why it ended (tool calls make it ``tool_calls``).
    :ivar finish: The engine's finish event (token counts, timings).
    """

    content: str
    reasoning: str
    calls: tuple[ToolCall, ...]
    reason: FinishReason
    finish: FinishEvent


class ServingEngine(Protocol):
    """What the runtime outside the engine room uses of an engine: the host, the model pool and
    :class:`EngineModel` hold one typed by this, so only runtime/engine imports the engine
    (:class:`mlxrt.engine.engine.Engine` and its distributed subclass satisfy it)."""

    config: EngineConfig
    loaded: LoadedModel | None
    memory: MemoryPlan | None
    adapters: AdapterRegistry
    #: The draft model of ``--draft-model`` (the start banner names it), or ``None``.
    speculator: Speculator | None
    #: Time to first token and whole-generation latency (``/metrics``).
    ttft: Histogram
    latency: Histogram
    #: The model this engine serves as hooks see it (:func:`serve` sets it before the load);
    #: the engine only hands it to the hooks it runs, as their ``model`` argument.
    served_model: object

    @property
    def profile(self) -> FamilyProfile: ...

    @property
    def lane(self) -> str:
        """``batch`` or ``serial``: how the model decodes."""
        ...

    @property
    def unhealthy(self) -> str | None:
        """Why this engine cannot serve any more (a distributed rank was lost), else ``None``
        (``/health`` answers 503 with it)."""
        ...

    @property
    def info(self) -> ModelInfo: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def safe_context(self) -> int | None: ...

    @property
    def context_ceiling(self) -> int | None: ...

    @property
    def keeps_snapshots(self) -> bool: ...

    def load(self, info: ModelInfo) -> None: ...

    def generate(self, request: GenerationRequest) -> Generation: ...

    async def call(self, fn: Callable[[LoadedModel], Any]) -> Any: ...

    def call_blocking(self, fn: Callable[[LoadedModel], Any]) -> Any: ...

    async def mount_adapter(self, adapter_id: str, path: str, owner: str = "") -> dict[str, Any]: ...

    async def unmount_adapter(self, adapter_id: str, owner: str = "") -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...

    def drain(self, grace: float) -> None: ...

    def stop(self) -> None: ...


@runtime_checkable
class ServedModel(Protocol):
    """One loaded model, as plugins and the HTTP edge see it.

    Every verb that blocks (``render``, ``plan``, ``plan_chat``, ``plan_text``, ``prepare``,
    ``count_tokens``, ``call_blocking``) runs templating, tokenizing or plugin hooks: call it
    from a worker thread, never on the event loop (``anyio.to_thread.run_sync``). The
    ``async`` verbs run on the event loop.
    """

    @property
    def info(self) -> ModelInfo:
        """The checkpoint: id, folder, config, context window."""
        ...

    @property
    def profile(self) -> FamilyProfile:
        """What the family plugins answered at load (parser, thinking format, vision…)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (:attr:`mlxrt.records.LoadedModel.tokenizer`: ``Any`` because
        it is mlxrt's ``TextTokenizer`` or mlx-lm's ``TokenizerWrapper``, which share no base)."""
        ...

    @property
    def context_ceiling(self) -> int | None:
        """The most prompt + answer tokens one request may take (context window, capped by the
        memory budget); ``None``: unknown."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What the server can do for this model (collected once, when the model is served)."""
        ...

    @property
    def kind(self) -> EngineKind:
        """How the model generates: ``autoregressive`` or ``denoising``."""
        ...

    @property
    def loaded(self) -> LoadedModel:
        """The loaded weights, for code that runs on the model's thread (:meth:`call`, a
        vision tower); never touch its arrays from another thread."""
        ...

    @property
    def settings(self) -> EngineConfig:
        """The serving settings (``--batch``, ``--max-queue``, ``--memory-budget`` …)."""
        ...

    @property
    def memory(self) -> MemoryPlan | None:
        """The measured memory plan (``None`` without one)."""
        ...

    @property
    def adapters(self) -> AdapterRegistry | None:
        """The mounted LoRA adapters (``None``: this model cannot mount any)."""
        ...

    def render(self, chat: ChatInput) -> RenderedPrompt:
        """``chat`` through the model's chat template, tokenized, its images spliced in."""
        ...

    def encode(self, text: str) -> list[int]:
        """Raw text as token ids, with the tokenizer's own special-token handling."""
        ...

    def plan(self, options: RequestOptions, prompt_ids: Sequence[int], *, dialect: str, request_id: str,
             default_max_tokens: int, partition: str = "") -> GenerationRequest:
        """The engine request for ``options`` and a tokenized prompt, canonicalized."""
        ...

    def plan_chat(self, chat: ChatInput, options: RequestOptions, *, dialect: str, request_id: str,
                  default_max_tokens: int, partition: str = "") -> tuple[RenderedPrompt, GenerationRequest]:
        """Render ``chat`` (with ``options.tools``), plan and prepare its engine request."""
        ...

    def plan_text(self, prompt: str, options: RequestOptions, *, dialect: str, request_id: str,
                  default_max_tokens: int, partition: str = "") -> GenerationRequest:
        """A raw text prompt (no chat template) tokenized, planned and prepared."""
        ...

    def prepare(self, request: GenerationRequest) -> None:
        """Run ``mlxrt_prepare_request`` (grammar compilation and its 400s)."""
        ...

    def generate(self, request: GenerationRequest) -> Generation:
        """Submit a planned request (call on the event loop); its event stream, an async iterator."""
        ...

    async def complete(self, chat: ChatInput, options: RequestOptions, *, dialect: str,
                       request_id: str | None = None) -> Completion:
        """Plan (off the event loop), run and assemble one chat turn: the finished answer."""
        ...

    def count_tokens(self, chat: ChatInput, *, dialect: str) -> int:
        """The prompt tokens ``chat`` would run with, canonicalized for ``dialect``."""
        ...

    async def call(self, fn: Callable[[LoadedModel], Any]) -> Any:
        """Run ``fn(loaded)`` on the model's thread, between decode steps; its result."""
        ...

    def call_blocking(self, fn: Callable[[LoadedModel], Any]) -> Any:
        """:meth:`call` from a thread that is not the event loop's."""
        ...

    async def mount_adapter(self, adapter_id: str, path: str, owner: str = "") -> dict[str, Any]:
        """Mount a LoRA adapter folder as ``owner``'s ``adapter_id`` (between decode steps)."""
        ...

    async def unmount_adapter(self, adapter_id: str, owner: str = "") -> dict[str, Any]:
        """Unmount ``owner``'s ``adapter_id`` (rows running with it finish with it)."""
        ...


#: The logit bias that bans a token (``ignore_eos``): far below any logit, finite so that a
#: log-probability stays a number JSON can carry.
EOS_BAN = -1e9


class EngineModel:
    """:class:`ServedModel` over one engine: the hooks its verbs run are given ``host`` (the
    plugin registry) and ``model=self``.

    The engine is held privately: nothing outside the runtime reaches it through here.
    """

    def __init__(self, host: PluginHost, engine: ServingEngine) -> None:
        self._host = host
        self._engine = engine
        self._declared: frozenset[str] = declared(host)
        self._capabilities: Capabilities | None = None

    # -- facts ----------------------------------------------------------------------------------

    @property
    def info(self) -> ModelInfo:
        return self._engine.info

    @property
    def profile(self) -> FamilyProfile:
        return self._engine.profile

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @property
    def context_ceiling(self) -> int | None:
        return self._engine.context_ceiling

    @property
    def capabilities(self) -> Capabilities:
        if self._capabilities is None:  # the profile is the load's: stated once
            self._capabilities = capabilities_of(self.profile, self._declared)
        return self._capabilities

    @property
    def declared(self) -> frozenset[str]:
        """The capability names the plugins declared when this model was served."""
        return self._declared

    @property
    def kind(self) -> EngineKind:
        return self.loaded.engine

    @property
    def loaded(self) -> LoadedModel:
        loaded = self._engine.loaded
        if loaded is None:  # served models are made for loaded engines; the vision hook reads it later
            raise RuntimeError(f"model {self.info.model_id!r} is not loaded yet")
        return loaded

    @property
    def settings(self) -> EngineConfig:
        return self._engine.config

    @property
    def memory(self) -> MemoryPlan | None:
        return self._engine.memory

    @property
    def adapters(self) -> AdapterRegistry | None:
        return self._engine.adapters

    def is_engine(self, engine: ServingEngine) -> bool:
        """Whether this view is over ``engine`` (the hosts' cache check)."""
        return self._engine is engine

    # -- verbs ----------------------------------------------------------------------------------

    def render(self, chat: ChatInput) -> RenderedPrompt:
        """The template's prompt (:func:`mlxrt.templating.render_chat`), then the chat's images
        fetched and decoded here (the caller's worker thread) and spliced in by the family's
        vision adapter on this model's thread (:func:`mlxrt.loading.vision.splice_images`)."""
        from mlxrt.templating import render_chat

        rendered = render_chat(self._host, self.tokenizer, self.profile, chat, model=self,
                               turn_boundary=self._engine.keeps_snapshots)
        if not chat.images:
            return rendered
        from mlxrt.loading.vision import splice_images

        vision = splice_images(self._host, self.profile, rendered.ids, chat.images, on_model=self.call_blocking)
        return attrs.evolve(rendered, ids=vision.ids, vision=vision)

    def encode(self, text: str) -> list[int]:
        """Raw text as token ids, with the tokenizer's own special-token handling (a BOS where
        the model wants one)."""
        from mlxrt.templating import encode_text

        return list(encode_text(self.tokenizer, text))

    def plan(self, options: RequestOptions, prompt_ids: Sequence[int], *, dialect: str, request_id: str,
             default_max_tokens: int, partition: str = "") -> GenerationRequest:
        """``--max-tokens`` (``host.options["max_tokens"]``) overrides ``default_max_tokens``;
        admission reduces it, or the client's ``options.max_tokens``, to what the context leaves
        after the prompt (a prompt that leaves no room is refused: ``ContextOverflow``).
        Sampling follows :func:`mlxrt.engine.sampling.resolve_sampling`'s chain; a forcing
        ``tool_choice`` becomes a grammar or forced openings (:func:`forced_tool_call`); an
        unknown ``adapter`` is a 400. ``partition`` is the caller (API key) the request runs as.
        """
        from mlxrt.engine.admission import check_choices, choice_ceiling, plan_max_tokens
        from mlxrt.engine.sampling import resolve_sampling
        from mlxrt.templating import canonicalize

        host, engine, info = self._host, self._engine, self.info
        vocab = info.config_int("vocab_size")
        for token in options.logit_bias:
            if token < 0 or (vocab is not None and token >= vocab):
                raise InvalidRequest(f"logit_bias token id {token} is not in the vocabulary"
                                     + (f" (0 to {vocab - 1})" if vocab is not None else ""), param="logit_bias")
        option = host.options.get("max_tokens")
        default = option if option is not None else default_max_tokens
        ceiling = engine.context_ceiling
        if options.n > 1:
            check_choices(options.n, engine.config.batch, engine.config.max_queue)
            ceiling = choice_ceiling(info.context_window, engine.safe_context, options.n)
        max_tokens = plan_max_tokens(len(prompt_ids), options.max_tokens, default, ceiling, choices=options.n,
                                     window=info.context_window)
        bias = options.logit_bias
        if options.ignore_eos:  # banned, as llama-server does: the answer ends at max_tokens or a stop
            bias = {**bias, **dict.fromkeys(self.tokenizer.eos_token_ids or (), EOS_BAN)}
        sampling = resolve_sampling(options.sampling, host.options, info.generation_config, seed=options.seed,
                                    logit_bias=bias)
        forced, structured = forced_tool_call(self, options.forced_tools, options.tools, prompt_ids,
                                              structured=options.structured, several=options.parallel_tool_calls)
        registry = self.adapters
        gen = GenerationRequest(
            request_id=request_id, prompt_ids=tuple(prompt_ids), max_tokens=max_tokens, sampling=sampling,
            stop=tuple(options.stop), dialect=dialect, extra=dict(options.extra), logprobs=options.logprobs,
            forced_prefixes=forced, structured=structured, num_draft_tokens=options.num_draft_tokens,
            adapters=registry.resolve(options.adapter) if registry else (), partition=partition,
            progress=options.progress,
        )
        host.check_request_fields(dialect, gen.extra)  # mlxrt_request_fields' checks: a bad value is a 400
        planned: GenerationRequest = canonicalize(host, gen, dialect, declared=self._declared, model=self)
        return planned

    def prepare(self, request: GenerationRequest) -> None:
        self._host.collect("mlxrt_prepare_request", request=request, info=self.info, host=self._host, model=self)

    @property
    def prepares(self) -> bool:
        """Whether any plugin prepares requests (else :meth:`prepare` does nothing, and a caller
        on the event loop may skip the thread hop)."""
        return bool(self._host.pm.hook.mlxrt_prepare_request.get_hookimpls())

    def plan_chat(self, chat: ChatInput, options: RequestOptions, *, dialect: str, request_id: str,
                  default_max_tokens: int, partition: str = "") -> tuple[RenderedPrompt, GenerationRequest]:
        from mlxrt.templating import rendered_request

        rendered = self.render(attrs.evolve(chat, tools=options.tools))
        gen = self.plan(options, rendered.ids, dialect=dialect, request_id=request_id,
                        default_max_tokens=default_max_tokens, partition=partition)
        gen = rendered_request(gen, rendered)
        self.prepare(gen)
        return rendered, gen

    def plan_text(self, prompt: str, options: RequestOptions, *, dialect: str, request_id: str,
                  default_max_tokens: int, partition: str = "") -> GenerationRequest:
        gen = self.plan(options, self.encode(prompt), dialect=dialect, request_id=request_id,
                        default_max_tokens=default_max_tokens, partition=partition)
        self.prepare(gen)
        return gen

    def generate(self, request: GenerationRequest) -> Generation:
        return self._engine.generate(request)

    async def complete(self, chat: ChatInput, options: RequestOptions, *, dialect: str,
                       request_id: str | None = None) -> Completion:
        """Templating, planning, ``mlxrt_prompt_canonicalize`` and ``mlxrt_prepare_request`` run on
        a worker thread; the request carries the rendered turn boundary (the prompt cache keeps
        it). ``options.max_tokens`` is also the default when the server sets none."""
        from contextlib import aclosing

        import anyio

        from mlxrt.assembly import ResponseAssembler, drain

        request_id = request_id or f"{dialect}-{uuid.uuid4().hex[:16]}"
        default = options.max_tokens if options.max_tokens is not None else 512
        rendered, request = await anyio.to_thread.run_sync(
            lambda: self.plan_chat(chat, options, dialect=dialect, request_id=request_id, default_max_tokens=default))
        assembler = ResponseAssembler(self.profile, tools=options.tools, starts_in_thinking=rendered.starts_in_thinking)
        async with aclosing(self.generate(request)) as gen:
            await gen.started()
            finish, _ = await drain(gen, assembler.feed)
        _delta, reason = assembler.finish(finish)
        return Completion(content="".join(assembler.content), reasoning="".join(assembler.reasoning),
                          calls=tuple(assembler.tool_calls), reason=reason, finish=finish)

    def count_tokens(self, chat: ChatInput, *, dialect: str) -> int:
        from mlxrt.templating import canonicalize

        rendered = self.render(chat)
        probe = GenerationRequest(request_id="count", prompt_ids=rendered.ids, max_tokens=1, dialect=dialect)
        return len(canonicalize(self._host, probe, dialect, declared=self._declared, model=self).prompt_ids)

    async def call(self, fn: Callable[[LoadedModel], Any]) -> Any:
        return await self._engine.call(fn)

    def call_blocking(self, fn: Callable[[LoadedModel], Any]) -> Any:
        return self._engine.call_blocking(fn)

    async def mount_adapter(self, adapter_id: str, path: str, owner: str = "") -> dict[str, Any]:
        """Mount an adapter folder as ``owner``'s ``adapter_id`` (between decode steps)."""
        return await self._engine.mount_adapter(adapter_id, path, owner)

    async def unmount_adapter(self, adapter_id: str, owner: str = "") -> dict[str, Any]:
        """Unmount ``owner``'s ``adapter_id`` (rows running with it finish with it)."""
        return await self._engine.unmount_adapter(adapter_id, owner)


def serve(host: PluginHost, engine: ServingEngine) -> EngineModel:
    """The :class:`EngineModel` over ``engine``, made once: the engine keeps it as ``served_model`` and
    gives it to the hooks it runs (``mlxrt_vision`` at load, ``mlxrt_sampler`` and
    ``mlxrt_logits_processors`` at admission). Call it before :meth:`ServingEngine.load`, so
    the family hooks of the load are told the model too."""
    served = engine.served_model
    if isinstance(served, EngineModel) and served.is_engine(engine):
        return served
    model = EngineModel(host, engine)
    engine.served_model = model
    return model


def choice_requests(generation: GenerationRequest, n: int) -> tuple[GenerationRequest, ...]:
    """The engine requests of ``n`` choices of one planned request: the first is
    ``generation`` itself, each other has its own id (``<id>-<index>``) and a seed derived from
    the request's (:func:`mlxrt.engine.sampling.choice_seed`); all of them share a
    ``choice_group`` (the scheduler's fairness between requests)."""
    from mlxrt.engine.sampling import choice_seed

    if n <= 1:
        return (generation,)
    group = generation.request_id
    return (attrs.evolve(generation, choice_group=group), *(attrs.evolve(
        generation, request_id=f"{group}-{i}", choice_group=group,
        sampling=attrs.evolve(generation.sampling, seed=choice_seed(generation.sampling.seed, i)))
        for i in range(1, n)))


def forced_openings(model: ServedModel, names: Sequence[str], prompt_ids: Sequence[int], *,
                    param: str) -> tuple[tuple[int, ...], ...]:
    """Token openings that force the answer to start with a call to one of ``names``: the
    family parser's ``opening(name)``, after the reasoning close marker when the prompt left
    a think block open (:func:`mlxrt.text.tool_calls.tool_choice_prefixes`, shared by every
    dialect). A parser without ``opening`` cannot enforce the choice: the client's 400.
    """
    from mlxrt.text.tool_calls import tool_choice_prefixes

    openings: tuple[tuple[int, ...], ...] = tool_choice_prefixes(model.profile, model.tokenizer, names, prompt_ids,
                                                                 param=param)
    return openings


def forced_tool_call(model: ServedModel, names: Sequence[str], tools: Sequence[Mapping[str, Any]] | None,
                     prompt_ids: Sequence[int], *, param: str = "tool_choice",
                     structured: StructuredOutput | None = None, several: bool = False
                     ) -> tuple[tuple[tuple[int, ...], ...], StructuredOutput | None]:
    """How a request whose ``tool_choice`` forces a call to one of ``names`` is enforced:
    ``(forced_prefixes, structured)`` for its :class:`~mlxrt.records.GenerationRequest`.

    By grammar when the family's parser describes its calls (``call_grammar``, see
    :mod:`mlxrt.text.tool_grammar`) and a plugin declares ``structured_outputs``
    (:mod:`mlxrt.capabilities`): the whole call, markup and schema-valid arguments, is
    enforced. Otherwise the call's opening is forced (:func:`forced_openings`) and the model
    writes the arguments. A forced call cannot also follow another constraint
    (``response_format``): the client's 400. With no forced call, a model whose tools mlxrt
    renders itself (:mod:`mlxrt.text.generic_tools`) has its reply held to free text or one
    well-formed call (:func:`mlxrt.text.tool_grammar.auto_tool_constraint`); ``several`` (the
    request allows parallel calls): one call or more. A forced choice is one call: a client
    that names the function (instructor, LangChain's structured output) wants that one, and a
    greedy small model under a grammar that allowed more repeats the call to ``max_tokens``.
    """
    from mlxrt.text.tool_calls import reasoning_lead
    from mlxrt.text.tool_grammar import auto_tool_constraint, tool_call_constraint

    profile, tokenizer = model.profile, model.tokenizer
    enforced = model.capabilities.structured_outputs
    if not names:
        renders_tools = getattr(profile, "tool_prompt", None) is not None
        if tools and renders_tools and structured is None and enforced:
            # tool_choice "auto" on a model whose tools mlxrt renders: text, or a well-formed call
            structured = auto_tool_constraint(profile, tokenizer, tools, several=several)
        return (), structured
    if enforced:
        lead = reasoning_lead(profile, tokenizer, prompt_ids)
        constraint = tool_call_constraint(profile, tokenizer, names, tools, lead, param=param)
        if constraint is not None:
            if structured is not None:
                raise InvalidRequest(f"{param} forcing a tool call cannot be combined with {structured.param}",
                                     param=param)
            return (), constraint
    return forced_openings(model, names, prompt_ids, param=param), structured
