"""OpenAI wire types (chat and text completions) and the rules their raw fields obey."""

from __future__ import annotations

from typing import Any

import attrs

from mlxrt.api.wire import FieldRule

__all__ = [
    "GenerationFields", "ChatCompletionRequest", "CompletionRequest", "StreamOptions",
    "GENERATION_RULES", "CHAT_RULES", "COMPLETION_RULES", "ROLES", "SAMPLING_FIELDS",
]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

#: Request fields that go through :func:`mlxrt.engine.sampling.resolve_sampling` unchanged.
SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "repetition_context_size",
    "presence_penalty", "presence_context_size",
    "frequency_penalty", "frequency_context_size",
    "xtc_probability", "xtc_threshold",
)

#: mlx_lm.server's validation table, with its texts (``<name> must be of type <type>``…);
#: shared by chat and text completions.
GENERATION_RULES = (
    FieldRule("stream", (bool,)),
    FieldRule("model", (str,)),
    FieldRule("max_tokens", (int,), min=1),
    FieldRule("max_completion_tokens", (int,), min=1),
    FieldRule("temperature", (float, int), min=0),
    FieldRule("top_p", (float, int), min=0, max=1),
    FieldRule("top_k", (int,), min=0),
    FieldRule("min_p", (float, int), min=0, max=1),
    FieldRule("seed", (int,)),
    FieldRule("n", (int,), min=1),
    FieldRule("repetition_penalty", (float, int), min=0),
    FieldRule("repetition_context_size", (int,), min=0),
    FieldRule("presence_penalty", (float, int)),
    FieldRule("presence_context_size", (int,), min=0),
    FieldRule("frequency_penalty", (float, int)),
    FieldRule("frequency_context_size", (int,), min=0),
    FieldRule("xtc_probability", (float, int), min=0, max=1),
    FieldRule("xtc_threshold", (float, int), min=0, max=1),
    FieldRule("logprobs", (bool,)),
    FieldRule("top_logprobs", (int,), min=0, max=11, allowed=(-1,)),
    FieldRule("stream_options", (dict,)),
    FieldRule("user", (str,)),
    FieldRule("num_draft_tokens", (int,), min=0),
    # llama-server's constraint fields (mlxrt.plugins.openai.llama_fields)
    FieldRule("grammar", (str,)),
    FieldRule("json_schema", (dict,)),
    # llama-server's telemetry switches (mlxrt.api.timings)
    FieldRule("timings_per_token", (bool,)),
    FieldRule("return_progress", (bool,)),
    # llama-server's and vLLM's: generate past the end-of-sequence tokens (they are banned)
    FieldRule("ignore_eos", (bool,)),
)

CHAT_RULES = (
    *GENERATION_RULES,
    FieldRule("chat_template_kwargs", (dict,)),
    FieldRule("tools", (list,)),
    FieldRule("reasoning_effort", (str,)),
    FieldRule("add_generation_prompt", (bool,)),
    FieldRule("continue_final_message", (bool,)),
    FieldRule("verbose", (bool,)),
    FieldRule("parallel_tool_calls", (bool,)),
)

#: OpenAI's legacy-completions fields mlxrt takes only at their neutral values (decode's
#: ``_NOT_YET_COMPLETIONS``): typed first, so ``echo: 0`` is a 400, not a ``false``.
COMPLETION_RULES = (*GENERATION_RULES, FieldRule("echo", (bool,)), FieldRule("suffix", (str,)),
                    FieldRule("best_of", (int,), min=1))


@attrs.frozen
class StreamOptions:
    include_usage: bool = False


@attrs.frozen
class GenerationFields:
    """The fields chat and text completions share (prompts, logit_bias and stop are decoded
    apart)."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int | None = None
    repetition_penalty: float | None = None
    repetition_context_size: int | None = None
    presence_penalty: float | None = None
    presence_context_size: int | None = None
    frequency_penalty: float | None = None
    frequency_context_size: int | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    user: str | None = None
    num_draft_tokens: int | None = None
    #: llama-server's: every streamed chunk carries the running ``timings`` (not only the last).
    timings_per_token: bool | None = None
    #: llama-server's: a stream carries ``prompt_progress`` chunks while the prompt is prefilled.
    return_progress: bool | None = None
    #: llama-server's and vLLM's: the end-of-sequence tokens are banned (a benchmark's fixed length).
    ignore_eos: bool | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` wins over ``max_tokens`` (mlx_lm.server's rule)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def logprob_count(self) -> int | None:
        """Alternatives per token, or ``None`` when no log-probabilities were asked for.

        ``top_logprobs > 0`` alone turns them on, as in mlx_lm.server (OpenAI would also
        want ``logprobs: true``)."""
        top = self.top_logprobs if self.top_logprobs is not None and self.top_logprobs > 0 else 0
        return top if (self.logprobs or top) else None


@attrs.frozen
class ChatCompletionRequest(GenerationFields):
    """The fields mlxrt reads from a chat-completions body (messages are decoded apart)."""

    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    #: vLLM's and transformers' template switches (:func:`mlxrt.plugins.openai.llama_fields.template_ending`).
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    #: llama-server's: answer with ``__verbose.prompt``, the rendered prompt.
    verbose: bool | None = None
    #: OpenAI's: ``false`` keeps the answer to one tool call.
    parallel_tool_calls: bool | None = None


@attrs.frozen
class CompletionRequest(GenerationFields):
    """The fields mlxrt reads from a text-completions body (the prompt is decoded apart)."""
