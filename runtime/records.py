"""Core records the hooks receive and return, and the engine's request and events.

Records are ``@attrs.frozen``: a plugin cannot mutate what another plugin sees. Interfaces
that plugins implement (tool parsers, samplers, logits processors, vision adapters) are
``typing.Protocol``s or callable aliases so any object of the right shape works.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = [
    "ChatInput",
    "PromptProgress",
    "ModelInfo",
    "LoadedModel",
    "EngineKind",
    "StructuredKind",
    "CacheStatus",
    "PluginStatus",
    "ThinkingFormat",
    "ThinkingKind",
    "ToolStreamMode",
    "ToolCall",
    "ToolParser",
    "ToolCallOpening",
    "ToolCallExtent",
    "ToolPrompt",
    "ToolCallGrammar",
    "StructuredOutput",
    "RequestOptions",
    "Capabilities",
    "VisionAdapter",
    "Denoiser",
    "SplicedPrompt",
    "FamilyProfile",
    "SamplingParams",
    "GenerationRequest",
    "TokenEvent",
    "TokenLogprob",
    "FinishEvent",
    "FinishReason",
    "FinishedTurn",
    "CacheReport",
    "PluginRecord",
    "Sampler",
    "LogitsProcessor",
]

#: ``(logprobs: mx.array) -> mx.array`` of sampled token ids, as in mlx-lm.
Sampler = Callable[[Any], Any]
#: ``(tokens: mx.array, logits: mx.array) -> mx.array``, as in mlx-lm.
LogitsProcessor = Callable[[Any, Any], Any]


@attrs.frozen
class ModelInfo:
    """What a family plugin is told about a model before it is loaded.

    :ivar model_id: The id the server answers with (repo id, folder name or embedded id).
    :ivar path: Local folder in Hugging Face layout.
    :ivar model_type: ``config.json``'s ``model_type`` (the text model's, for nested configs,
        is in ``text_model_type``).
    :ivar config: The parsed ``config.json``.
    :ivar special_tokens: Added-token text → id, from ``tokenizer.json``; families look their
        sentinel ids up here instead of hard-coding them.
    :ivar chat_template: The chat template text, if the checkpoint ships one.
    :ivar source: Where the model came from: ``folder``, ``hf-cache``, ``gguf`` or ``embedded``.
    :ivar generation_config: The parsed ``generation_config.json`` (sampling defaults).
    """

    model_id: str
    path: Path
    model_type: str
    config: Mapping[str, Any] = attrs.field(factory=dict)
    special_tokens: Mapping[str, int] = attrs.field(factory=dict)
    chat_template: str | None = None
    source: str = "folder"
    generation_config: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def text_model_type(self) -> str:
        """The text model's type: ``text_config.model_type`` when nested, else ``model_type``."""
        text = self.config.get("text_config")
        nested = text.get("model_type") if isinstance(text, Mapping) else None
        return nested if isinstance(nested, str) else self.model_type

    def config_int(self, key: str) -> int | None:
        """An integer of the config, looked up at the top level, then in ``text_config``."""
        for cfg in (self.config, self.config.get("text_config") or {}):
            value = cfg.get(key) if isinstance(cfg, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    @property
    def context_window(self) -> int | None:
        """``max_position_embeddings`` of the (text) config, if stated."""
        return self.config_int("max_position_embeddings")


class EngineKind(enum.StrEnum):
    """How a loaded model generates (``LoadedModel.engine``; plugins may pass the string)."""

    AUTOREGRESSIVE = "autoregressive"
    DENOISING = "denoising"


@attrs.frozen
class LoadedModel:
    """A loaded model: what ``mlxrt_load_model`` returns.

    :ivar model: The ``mlx.nn.Module`` (mlx-lm's model protocol: ``model(inputs, cache=...)``).
    :ivar tokenizer: What :func:`mlxrt.text.tokenizer.load_tokenizer` returns: a
        :class:`~mlxrt.text.tokenizer.TextTokenizer`, or mlx-lm's ``TokenizerWrapper`` where it
        must fall back; either offers ``encode``, ``decode``, ``apply_chat_template``,
        ``chat_template``, ``eos_token_id(s)``, ``vocab_size`` and ``get_vocab``.
    :ivar engine: ``autoregressive`` (the default) or ``denoising``: a model that does not
        decode token by token. A ``denoising`` model must supply ``denoiser``; the engine runs it
        on the serial lane (:mod:`mlxrt.engine.denoising_lane`), with no prompt cache and no batching.
    :ivar denoiser: The generator of a ``denoising`` model (see :class:`Denoiser`).
    :ivar dtype: Set by the runtime after the load, not by plugins: the dtype the weights are
        served in and why (a :class:`mlxrt.loading.dtype_choice.DtypeChoice`; ``--dtype``).
    """

    model: Any
    tokenizer: Any
    engine: EngineKind = attrs.field(default=EngineKind.AUTOREGRESSIVE, converter=EngineKind)
    denoiser: Denoiser | None = None
    dtype: Any = None


class ThinkingKind(enum.StrEnum):
    THINK_TAG = "think-tag"
    GEMMA_CHANNEL = "gemma-channel"


@attrs.frozen
class ThinkingFormat:
    """How a model marks its reasoning in the generated text.

    :ivar kind: The marker style.
    :ivar open: Text that opens a reasoning span (e.g. ``<think>``).
    :ivar close: Text that closes it (e.g. ``</think>``).
    :ivar starts_in_thinking: True when the chat template's generation prompt already opened the
        span, so generation starts inside reasoning. mlxrt also detects this per request from the
        rendered prompt (a prompt ending in an unclosed ``open``).
    """

    kind: ThinkingKind = ThinkingKind.THINK_TAG
    open: str = "<think>"
    close: str = "</think>"
    starts_in_thinking: bool = False


class ToolStreamMode(enum.StrEnum):
    """How tool calls are found in a generation."""

    #: Token-id sentinels (Gemma 4): routed by id, never by text.
    GEMMA_SENTINEL = "gemma-sentinel"
    #: Decoded text is buffered and parsed when tools are present.
    BUFFERED_TEXT = "buffered-text"
    #: No tool parsing; text streams as it is.
    PLAIN = "plain"


@attrs.frozen
class ToolCall:
    """One parsed tool call: a function name and its JSON-encoded arguments."""

    name: str
    arguments: str
    id: str | None = None


@runtime_checkable
class ToolParser(Protocol):
    """Parses tool calls out of generated text (mirrors mlx-lm's tool parser modules).

    ``start``/``end`` are the markers that delimit one call; ``parse`` turns the text between
    them into calls, decoding arguments against the tools' JSON schemas.
    """

    start: str
    end: str

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]: ...


@runtime_checkable
class ToolCallExtent(Protocol):
    """Optional: a tool parser that says where a call ends when a value may hold its end marker.

    ``call_end(text)``: ``text`` begins with the parser's ``start``; the length of the call
    there, through its end marker, or ``None`` while the text ends inside it (an unfinished
    call, which the router drops). Without it the first ``end`` after ``start`` closes a call.
    """

    def call_end(self, text: str) -> int | None: ...


@runtime_checkable
class ToolCallOpening(Protocol):
    """Optional: a tool parser that can say how a call to ``name`` begins.

    ``opening(name)`` is the exact text a call to ``name`` starts with (Qwen3:
    ``<tool_call>\n{"name": "NAME", "arguments": ``). ``tool_choice`` ``"required"`` and a
    named choice are enforced by forcing the answer's first tokens to one of these openings;
    a parser without ``opening`` makes those choices a 400.
    """

    def opening(self, name: str) -> str: ...


@runtime_checkable
class ToolPrompt(Protocol):
    """How tools reach a model whose chat template renders none (``mlxrt_tool_prompt``).

    ``render(messages, tools)`` returns the conversation to give the template instead: the
    tools described (a system message, typically), past calls and tool results written the way
    the prompt asks for them. ``parser`` reads the calls the model then writes (a
    :class:`ToolParser`; with ``opening``/``call_grammar`` for ``tool_choice`` enforcement).
    Optional: ``auto_grammar(tools, g)`` → a grammar expression (see
    :class:`mlxrt.text.tool_grammar.CallGrammar`) that holds a ``tool_choice: "auto"`` reply to
    free text or one well-formed call (applied when the ``structured`` plugin is present).
    mlxrt's own is :class:`mlxrt.text.generic_tools.GenericToolPrompt`.
    """

    parser: ToolParser

    def render(self, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]: ...


@attrs.frozen
class SplicedPrompt:
    """A prompt with its images spliced in: what :meth:`VisionAdapter.splice` returns.

    :ivar ids: The prompt ids with each image placeholder expanded to the family's
        begin-of-image id, one soft-token placeholder id per image embedding, and the
        end-of-image id (Gemma 4: ``<|image>`` + N × ``<|image|>`` + ``<image|>``). Usage and
        admission count these.
    :ivar embeddings: ``mx.array`` ``[len(ids), hidden]``: the input embeddings the model is
        fed for the prompt instead of looking ``ids`` up (text rows are the token embeddings,
        image rows the tower's output), in the scale the model's ``input_embeddings``
        argument expects.
    :ivar feed_ids: The ids passed to the model beside ``embeddings``, when they differ from
        ``ids`` (Gemma 4 feeds pad at image rows, for its per-layer inputs); ``None``: ``ids``.
    :ivar images: How many images were spliced.
    :ivar prefill: ``None``, or a callable giving a context manager the engine enters around
        the request's generation; the engine then prefills the prompt (all but its last
        token) in one forward pass from an empty cache, so a family can change the attention
        of that pass (Gemma 4's larger checkpoints let image tokens attend bidirectionally).
    """

    ids: tuple[int, ...]
    embeddings: Any = attrs.field(eq=False, repr=False)
    feed_ids: tuple[int, ...] | None = None
    images: int = 0
    prefill: Any = attrs.field(default=None, eq=False, repr=False)


@runtime_checkable
class ToolCallGrammar(Protocol):
    """Optional: a tool parser that can describe a whole call to ``name`` as a grammar.

    ``call_grammar(name, parameters, g)`` returns one call (markup and arguments valid under
    the tool's JSON-schema ``parameters``) as an expression built with ``g``, a
    :class:`mlxrt.text.tool_grammar.CallGrammar` (``g.literal(text)``, ``g.json(schema)``,
    ``g.regex(pattern)``; combine with spaces, ``|``, ``( )*``), or ``None`` when it cannot
    describe that call. ``tool_choice`` ``"required"`` and a named choice are then enforced by
    grammar (the structured-outputs plugin masks every step), not only by the opening.
    """

    def call_grammar(self, name: str, parameters: Mapping[str, Any], g: Any) -> str | None: ...


@runtime_checkable
class VisionAdapter(Protocol):
    """Turns images into embeddings spliced into the prompt (one per loaded model).

    ``splice(prompt_ids, images)`` is called per request, on the engine's worker thread
    (between decode steps), with the templated prompt ids (one placeholder id where the chat
    template put each image) and the decoded images in prompt order, each an RGB
    :class:`PIL.Image.Image` with its EXIF orientation applied (:mod:`mlxrt.loading.images`). It
    returns a :class:`SplicedPrompt`, or raises :class:`~mlxrt.errors.InvalidRequest`
    (placeholder count differs from the image count, an image the tower cannot take). The
    adapter should load its tower on the first call, so text-only sessions never pay for it.
    """

    def splice(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> SplicedPrompt: ...


@runtime_checkable
class Denoiser(Protocol):
    """A non-autoregressive generator (``LoadedModel.engine == "denoising"``, e.g. DiffusionGemma).

    ``generate(prompt, request, should_cancel)`` runs on the engine's worker thread and yields
    *settled blocks* of token ids, in order: ids that will not change any more. The engine
    detokenizes each block, applies stop strings, and streams the block's text as one event.

    :param prompt: ``request.prompt_ids``, or what the family's vision adapter's ``splice``
        returned for the request's images (the family's own type).
    :param request: The :class:`GenerationRequest` (``max_tokens``, ``sampling.temperature``
        and ``sampling.seed`` are the generator's to honour).
    :param should_cancel: Returns True once the client left or the request timed out; poll it
        between model passes and return early.

    The ids yielded add up to at most ``request.max_tokens``; a block may end with an
    end-of-sequence id (the engine ends the generation there with ``stop``).
    """

    def generate(self, prompt: Any, request: GenerationRequest,
                 should_cancel: Callable[[], bool]) -> Iterator[Sequence[int]]: ...


@attrs.frozen
class FamilyProfile:
    """Every family answer for one loaded model, resolved once at load time.

    ``provenance`` maps each aspect (``load_model``, ``tool_parser``, ``thinking_format``, …) to
    the plugin that answered, or ``mlx-lm`` / ``default`` when the host's fallback did.
    """

    info: ModelInfo
    thinking_format: ThinkingFormat | None = None
    tool_parser: ToolParser | None = None
    tool_stream_mode: ToolStreamMode = ToolStreamMode.PLAIN
    tool_stream_mode_with_tools: ToolStreamMode = ToolStreamMode.BUFFERED_TEXT
    vision: VisionAdapter | None = None
    #: How mlxrt renders tools itself, for a chat template that renders none (``None``: the
    #: template does); its parser is then :attr:`tool_parser`.
    tool_prompt: ToolPrompt | None = None
    provenance: Mapping[str, str] = attrs.field(factory=dict)
    #: The load-time self-test: capability (``template``, ``tools``, ``tool_result``,
    #: ``thinking``) → ``"pass"``, ``"fail: why"`` or ``"n/a"`` (see :mod:`mlxrt.loading.self_test`).
    self_test: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def tier(self) -> str:
        """``family`` when a family plugin answered any aspect of this model, else ``generic``
        (mlx-lm loads it and it serves plain chat: no reasoning split, no tool parsing)."""
        return "family" if any(v not in ("mlx-lm", "default") for v in self.provenance.values()) else "generic"

    @property
    def family(self) -> str:
        """The family plugin serving the model, as the banner, ``/v1/models`` and the pages say:
        the plugin that answered the tool parser or thinking format (mlx-lm loads most family
        models itself), else the loader's name (``mlx-lm`` when the host's fallback loaded it)."""
        prov = self.provenance
        return prov.get("tool_parser") or prov.get("thinking_format") or prov.get("load_model", "mlx-lm")


@attrs.frozen
class SamplingParams:
    """Sampling settings for one request, after defaults were applied."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    #: Token id → additive bias on its logit (mlx-lm's ``logit_bias`` processor).
    logit_bias: Mapping[int, float] = attrs.field(factory=dict)
    #: Multiplicative penalty on recent tokens' logits; 0 (or 1) is off.
    repetition_penalty: float = 0.0
    #: How many of the latest tokens the penalties look at; 0 means the whole history.
    repetition_context_size: int = 20
    #: Subtracted once from the logit of each token present in the window.
    presence_penalty: float = 0.0
    presence_context_size: int = 20
    #: Subtracted from a token's logit once per occurrence in the window.
    frequency_penalty: float = 0.0
    frequency_context_size: int = 20
    #: Chance per token that XTC removes the likely tokens above ``xtc_threshold``.
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CANCELLED = "cancelled"


@attrs.frozen
class ChatInput:
    """A dialect-neutral chat turn to render.

    :ivar messages: OpenAI-shaped messages (role, content, tool_calls, …), already validated.
    :ivar tools: OpenAI function tools, or ``None``.
    :ivar template_kwargs: The client's ``chat_template_kwargs``.
    :ivar reasoning_effort: The client's ``reasoning_effort``, if given.
    :ivar images: The messages' images in prompt order (:class:`mlxrt.loading.images.ImageRef`); a
        message with images has list content where each image is a ``{"type": "image"}`` part.
    :ivar add_generation_prompt: End the prompt with the template's generation prompt (the
        opening of a new assistant turn); ``False`` renders the messages only.
    :ivar continue_final_message: The answer continues the last message (an assistant
        prefill) instead of closing it: the prompt ends right after its text. Never together
        with ``add_generation_prompt``.
    """

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None = None
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    reasoning_effort: str | None = None
    images: tuple[Any, ...] = ()
    add_generation_prompt: bool = True
    continue_final_message: bool = False


@attrs.frozen
class GenerationRequest:
    """What a dialect hands the engine: token ids and how to continue them.

    :ivar request_id: Unique per request (the dialect's response id).
    :ivar prompt_ids: The prompt, already templated and tokenized.
    :ivar max_tokens: Tokens to generate at most (EOS counts).
    :ivar sampling: Sampling settings.
    :ivar stop: Stop strings, matched on decoded text.
    :ivar dialect: Which dialect built the request (``openai``, ``anthropic``, …).
    :ivar extra: Plugin-claimed request fields (``mlxrt_request_fields``), by name.
    :ivar logprobs: How many alternatives to report per token, or ``None`` for none.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    dialect: str = "openai"
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    #: ``None``: no log-probabilities (nothing is computed); ``k >= 0``: each token event
    #: carries the emitted token's log-probability and the ``k`` most likely alternatives.
    logprobs: int | None = None
    #: The adapter set the request runs with (names, in order); ``()`` is the base model.
    #: Prompt-cache entries are keyed by it, so KV from one adapter set is never reused by another.
    adapters: tuple[str, ...] = ()
    #: Whose request this is (:func:`mlxrt.api.auth.caller_of`: a digest of its API key, ``""``
    #: without keys). Prompt-cache entries are partitioned by it too, so one key never reuses,
    #: or learns by hits and timings, another key's prompt.
    partition: str = ""
    #: ``tool_choice`` enforcement: the answer must begin with one of these token sequences
    #: (the tool-call opening and name of each allowed tool); ``()`` is unconstrained. Family
    #: plugins apply it with :func:`mlxrt.text.tool_calls.tool_choice_processors`.
    forced_prefixes: tuple[tuple[int, ...], ...] = ()
    #: Structured output the answer must follow (a JSON schema, any JSON object, a regex or
    #: a choice list), enforced by a grammar; ``None`` leaves the text free.
    structured: StructuredOutput | None = None
    #: The prompt with its images spliced in (``prompt_ids`` are then ``vision.ids``): the
    #: engine prefills from ``vision.embeddings``, bypasses the prompt cache and runs the
    #: request in the serial lane. ``None`` for text-only prompts.
    vision: SplicedPrompt | None = attrs.field(default=None, eq=False, repr=False)
    #: Tokens the draft model proposes per step (``--draft-model``); ``None``: the server's
    #: ``--num-draft-tokens``; ``0``: decode without the draft. No effect without a draft.
    num_draft_tokens: int | None = None
    #: Prompt tokens before the chat template's generation prompt (where the last message
    #: ends): the next turn re-renders the prompt up to here, so a model whose cache cannot
    #: be rewound keeps a prompt-cache snapshot at it. ``None`` when unknown (completions).
    turn_start: int | None = None
    #: Report prefill progress: the engine delivers a :class:`PromptProgress` event before
    #: prefill, after each prefill chunk and when the first token is known (llama-server's
    #: ``return_progress``). Only a consumer that handles the events asks for them.
    progress: bool = False
    #: The request this is one choice of (OpenAI's ``n``; its first choice's ``request_id``),
    #: ``""`` for a request of one choice: admission keeps one request's choices from holding
    #: every row while other requests wait (:mod:`mlxrt.engine.scheduler`).
    choice_group: str = ""


class StructuredKind(enum.StrEnum):
    """What a structured-output constraint is (``StructuredOutput.kind``)."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    LARK = "lark"
    GBNF = "gbnf"


@attrs.frozen
class StructuredOutput:
    """An output constraint, independent of the dialect that asked for it and of the grammar
    library that enforces it (the ``structured`` plugin).

    :ivar kind: ``json_schema``, ``json_object``, ``regex``, ``choice``, ``lark`` (a whole grammar in
        llguidance's Lark dialect: a forced tool call, see :mod:`mlxrt.text.tool_grammar`) or
        ``gbnf`` (a whole grammar in llama.cpp's GBNF: the ``grammar`` request field).
    :ivar spec: The canonical text of the constraint: the schema as compact JSON (the client's key order,
        which is the generated object's), the
        regex, or the choices as a JSON list. With ``kind`` it keys the compiled-grammar cache.
    :ivar param: The request field that carried it, for error messages
        (``response_format``, ``text.format``, ``tools``).
    """

    kind: StructuredKind = attrs.field(converter=StructuredKind)
    spec: str = ""
    param: str = "response_format"


class CacheStatus(enum.StrEnum):
    """What the prompt cache did for one request (``CacheReport.status``)."""

    HIT = "hit"
    PARTIAL = "partial"
    MISS = "miss"
    OFF = "off"


@attrs.frozen
class RequestOptions:
    """How a decoded body asks to be answered, in one dialect-neutral record: what every
    dialect's decoder produces and :meth:`mlxrt.serving.ServedModel.plan` turns into a
    :class:`GenerationRequest`. It travels with the request, so the answer's assembler reads
    the request's tools here and no dialect carries them across the engine call.

    :ivar sampling: The client's sampling fields by :class:`SamplingParams` name (``None`` or
        absent: not given), resolved through :func:`mlxrt.engine.sampling.resolve_sampling`'s chain.
    :ivar max_tokens: The client's token limit (``None``: the dialect's default); reduced to
        what the context leaves after the prompt when larger (every dialect alike).
    :ivar seed: The sampling seed (``None``: the server's default seeding).
    :ivar stop: Stop strings, matched on decoded text.
    :ivar logit_bias: Token id → bias (ids are checked against the vocabulary when planned).
    :ivar logprobs: Alternatives to report per token, or ``None`` for no log-probabilities.
    :ivar adapter: The ``adapter`` field (``"id"``, ``"a+b"``, ``"none"``); ``None`` runs the
        server's default adapter set.
    :ivar tools: The request's function tools (OpenAI-shaped), or ``None``.
    :ivar forced_tools: Tools the answer must call (``tool_choice`` forcing a call); ``()``
        leaves the model free.
    :ivar parallel_tool_calls: The answer may hold several calls (OpenAI's ``parallel_tool_calls``,
        Anthropic's ``disable_parallel_tool_use`` negated); grammars that force or shape a call
        on a model whose tools mlxrt renders allow several only then.
    :ivar structured: The output constraint (``response_format``, ``text.format``); ``None`` is
        free text.
    :ivar num_draft_tokens: Draft tokens per step for speculative decoding (``None``: the
        server's ``--num-draft-tokens``).
    :ivar extra: Plugin-claimed request fields (``mlxrt_request_fields``), by name.
    :ivar n: Choices to generate for the one prompt (OpenAI's ``n``): each is its own engine
        request, seeded from ``seed`` (:func:`mlxrt.engine.sampling.choice_seed`).
    :ivar progress: Stream :class:`PromptProgress` events while the prompt is prefilled
        (:attr:`GenerationRequest.progress`).
    :ivar ignore_eos: Generation goes on past the end-of-sequence tokens (llama-server's and
        vLLM's ``ignore_eos``): the model's end-of-sequence ids are banned by a logit bias, so
        it ends at ``max_tokens`` or a stop string.
    """

    sampling: Mapping[str, Any] = attrs.field(factory=dict)
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: Mapping[int, float] = attrs.field(factory=dict)
    logprobs: int | None = None
    adapter: str | None = None
    tools: tuple[Mapping[str, Any], ...] | None = None
    forced_tools: tuple[str, ...] = ()
    parallel_tool_calls: bool = True
    structured: StructuredOutput | None = None
    num_draft_tokens: int | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    n: int = 1
    progress: bool = False
    ignore_eos: bool = False


@attrs.frozen
class Capabilities:
    """What the server can do for requests to one served model, stated, not guessed
    (:func:`mlxrt.capabilities.capabilities`).

    :ivar structured_outputs: Output constraints (``response_format``, ``text.format``, forced
        tool-call grammars) are enforced: a plugin declares ``structured_outputs`` in
        ``mlxrt_capabilities``.
    :ivar vision: The model reads images (its family answered ``mlxrt_vision``).
    :ivar embeddings: The model is an embedding model (``/v1/embeddings``).
    """

    structured_outputs: bool = False
    vision: bool = False
    embeddings: bool = False


@attrs.frozen
class CacheReport:
    """What the prompt cache did for one request, known once the request starts running.

    :ivar status: ``hit`` (every reusable prompt token came from the cache), ``partial`` (a
        prefix came from the cache, then the prompt diverged from the closest entry), ``miss``
        (nothing reused) or ``off`` (the cache is disabled or bypassed for this request).
    :ivar cached_tokens: Prompt tokens whose KV was reused (``usage.prompt_tokens_details``).
    :ivar prompt_tokens: The prompt's length.
    :ivar diverged_at: On a miss or partial hit, the token index where the prompt first differs
        from the closest cached entry; ``None`` when no entry was close or on a full hit.
    :ivar snippet: The prompt's text from ``diverged_at`` (a few tokens, decoded), for debugging.
    :ivar reason: On a miss or partial hit, why no more was reused: ``prompt diverged``,
        ``sliding window`` or ``recurrent state`` (the closest entry could not be rewound to
        where the prompt left it), ``no cached prompt``; ``None`` otherwise.
    """

    status: CacheStatus = attrs.field(converter=CacheStatus)
    cached_tokens: int
    prompt_tokens: int
    diverged_at: int | None = None
    snippet: str | None = None
    reason: str | None = None

    def header(self) -> str:
        """The ``x-mlxrt-cache`` response header value, e.g. ``partial; cached=812; prompt=900;
        diverged_at=812; reason=prompt diverged``."""
        parts = [self.status, f"cached={self.cached_tokens}", f"prompt={self.prompt_tokens}"]
        if self.diverged_at is not None:
            parts.append(f"diverged_at={self.diverged_at}")
        if self.reason is not None:
            parts.append(f"reason={self.reason}")
        return "; ".join(parts)


@attrs.frozen
class TokenLogprob:
    """One candidate token of a step: its id, log-probability and text in context."""

    id: int
    logprob: float
    text: str


@attrs.frozen
class TokenEvent:
    """Text that became stable after one generated token.

    ``text`` is the longest newly decoded prefix that can no longer change (never half a
    UTF-8 character, never the start of a stop string); it may be empty.

    When the request asked for log-probabilities (``GenerationRequest.logprobs``), the event
    also describes its token: ``logprob`` from the distribution after logits processors and
    before temperature and filters, ``top_logprobs`` best first, and ``piece``, the text this
    token added to the decoded stream before stop matching (what the detokenizer released
    for it, so the pieces of all tokens concatenate to the generated text).
    """

    token: int
    text: str
    logprob: float | None = None
    top_logprobs: tuple[TokenLogprob, ...] = ()
    piece: str = ""


@attrs.frozen
class PromptProgress:
    """How far the prefill of a request's prompt has come (only for a request that asked:
    :attr:`GenerationRequest.progress`), counted in the model's own tokens.

    :ivar total: The prompt's tokens.
    :ivar cache: Prompt tokens reused from the prompt cache (never run again).
    :ivar processed: Prompt tokens the model's cache holds so far, ``cache`` included; it
        grows with every report and equals ``total`` once the first token is known.
    :ivar seconds: Time since the request started running (after admission and the
        prompt-cache lookup).
    """

    total: int
    cache: int
    processed: int
    seconds: float


@attrs.frozen
class FinishEvent:
    """The last event of every generation.

    ``prompt_seconds`` and ``decode_seconds`` are the engine's clock: from the start of the
    request's run (after admission and the prompt-cache lookup) to its first token (the
    prefill, with the first token's sampling), and from the first token to the last (both 0.0
    when no token was generated)."""

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    text: str = ""
    #: The stop string that ended the generation (``finish_reason`` ``stop``), if one did;
    #: ``None`` for an end-of-sequence token (Anthropic's ``stop_sequence`` vs ``end_turn``).
    stop_sequence: str | None = None
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    #: The request ran into ``--request-timeout`` while generating: it ended there, with
    #: ``finish_reason`` ``length`` (the answer says so: ``x-mlxrt-finish``, the log).
    timed_out: bool = False


@attrs.frozen
class RequestField:
    """A request-body field a plugin claims (``mlxrt_request_fields``), with its check.

    :ivar type: The JSON value's Python type (``dict``, ``str`` …): the dialect's decoder
        refuses another with a 400 and passes the value on in ``GenerationRequest.extra``.
    :ivar validate: Called with the value for every request that sets the field, on a worker
        thread while the request is planned (before a response starts, so a streamed request
        gets its 400 too); raise :class:`~mlxrt.errors.InvalidRequest` for a bad value. Its
        return value is ignored.
    """

    type: type
    validate: Callable[[Any], object] | None = None


@attrs.frozen
class FinishedTurn:
    """One chat turn a dialect answered in full (what ``mlxrt_turn_finished`` observers see).

    :ivar dialect: The API that served it (``openai``, ``anthropic``, ``responses``).
    :ivar request_id: The dialect's response id.
    :ivar model: The served model's id.
    :ivar messages: The conversation the model answered, OpenAI-shaped and dialect-neutral
        (:attr:`mlxrt.records.ChatInput.messages`).
    :ivar content: The answer's text (reasoning and tool-call markup removed).
    :ivar reasoning: The answer's reasoning text, if the model reasoned.
    :ivar tool_calls: The tool calls the answer made.
    :ivar finish_reason: Why generation ended.
    :ivar caller: Who asked (:func:`mlxrt.api.auth.caller_of`: the API key's digest, ``""``
        without keys): an observer that keeps turns keeps each caller's apart.
    :ivar store: Whether the client lets the server keep the turn (Responses' ``store: false``
        says no): an observer must not store a turn with ``store`` false.
    """

    dialect: str
    request_id: str
    model: str
    messages: tuple[Mapping[str, Any], ...]
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason = FinishReason.STOP
    caller: str = ""
    store: bool = True


class PluginStatus(enum.StrEnum):
    """Whether a plugin is in use (``PluginRecord.status``)."""

    LOADED = "loaded"
    FAILED = "failed"
    DISABLED = "disabled"


@attrs.frozen
class PluginRecord:
    """What the host knows about one plugin: shown by ``mlxrt plugins``."""

    name: str
    dist: str | None
    version: str | None
    kind: str
    status: PluginStatus = attrs.field(converter=PluginStatus)
    hooks: tuple[str, ...] = ()
    error: str | None = None
    builtin: bool = False
