"""The engine's configuration: ``mlxrt serve``'s engine flags as one frozen record, and their
defaults, stated once."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

__all__ = ["ENGINE_DEFAULTS", "EngineConfig"]

#: The engine flags' defaults by ``mlxrt serve`` option name (``--prefill-step-size`` →
#: ``prefill_step_size``), stated here only: the click options show them (``mlxrt serve
#: --help``), :class:`EngineConfig`'s fields default to them and :meth:`EngineConfig.from_options`
#: falls back to them, so a server built in process without the command line (tests,
#: ``mlxrt.testing``) runs the engine ``mlxrt serve`` would. The other engine flags default to
#: ``None`` (off, or decided at load).
ENGINE_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "batch": 8,
    "prompt_concurrency": 8,
    "prefill_step_size": 2048,
    "max_queue": 256,
    "prompt_cache_size": 10,
    "kv_group_size": 64,
    "num_draft_tokens": 3,
    "prompt_cache_dir_size": 10.0,  # GB (10^9 bytes): EngineConfig.prompt_cache_dir_bytes
    # Seconds; generous (llama-server's HTTP timeout), yet a runaway generation (a structured
    # list repeating one item until the window is full) ends; 0 turns it off.
    "request_timeout": 600.0,
})


def _gb(value: Any) -> int:
    return int(float(value) * 10**9)


@attrs.frozen
class EngineConfig:
    """The engine's knobs (``mlxrt serve`` flags of the same names).

    :ivar batch: Rows decoded together (a lone stream still decodes in the serial lane's loop);
        1 runs every request in the serial lane.
    :ivar prompt_concurrency: Newcomers prefilled together in the batch lane.
    :ivar prefill_step_size: Prompt tokens per prefill chunk.
    :ivar max_queue: Requests that may wait for admission; past it, 429.
    :ivar request_timeout: Seconds a request may take from submission to its last token
        (waiting past it: 429; running past it: it ends with ``length``, said in its
        :class:`~mlxrt.records.FinishEvent`); ``None`` for no limit.
    :ivar memory_budget: Bytes the model may use in all, or ``None`` for no budget.
    :ivar prompt_cache_size: Prompt-cache entries at most (0 disables the cache).
    :ivar prompt_cache_bytes: Prompt-cache bytes at most; ``None`` sizes it from the budget.
    :ivar adapter: An adapter folder mounted at start (id: its base name), the default of
        requests that name none (``--adapter`` / ``--adapter-path``).
    :ivar adapter_dirs: Folders ``GET /v1/adapters/available`` scans (``--adapter-dir``).
    :ivar kv_quant: ``off``, ``4``, ``8`` or ``None`` (the model's kv_config.json if any).
    :ivar kv_bits: mlx_lm.server's ``--kv-bits`` (from ``quantized_kv_start`` tokens).
    :ivar draft_model: ``--draft-model``: a draft for speculative decoding (serial lane only;
        see :mod:`mlxrt.engine.speculative`), or ``None``.
    :ivar num_draft_tokens: ``--num-draft-tokens``: tokens drafted per step by default.
    :ivar prompt_cache_dir: ``--prompt-cache-dir``: prompt-cache entries also kept there, restored
        after a restart (see :mod:`mlxrt.cache.prompt_store`), or ``None``.
    :ivar prompt_cache_dir_bytes: ``--prompt-cache-dir-size``: bytes that folder may hold.
    """

    batch: int = ENGINE_DEFAULTS["batch"]
    prompt_concurrency: int = ENGINE_DEFAULTS["prompt_concurrency"]
    prefill_step_size: int = ENGINE_DEFAULTS["prefill_step_size"]
    max_queue: int = ENGINE_DEFAULTS["max_queue"]
    request_timeout: float | None = ENGINE_DEFAULTS["request_timeout"]
    memory_budget: int | None = None
    prompt_cache_size: int = ENGINE_DEFAULTS["prompt_cache_size"]
    prompt_cache_bytes: int | None = None
    adapter: str | None = None
    adapter_dirs: tuple[str, ...] = ()
    kv_quant: str | None = None
    kv_bits: int | None = None
    kv_group_size: int = ENGINE_DEFAULTS["kv_group_size"]
    quantized_kv_start: int | None = None
    draft_model: str | None = None
    num_draft_tokens: int = ENGINE_DEFAULTS["num_draft_tokens"]
    prompt_cache_dir: str | None = None
    prompt_cache_dir_bytes: int = _gb(ENGINE_DEFAULTS["prompt_cache_dir_size"])

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> EngineConfig:
        """From ``mlxrt serve``'s parsed options (missing ones take :data:`ENGINE_DEFAULTS`)."""
        from mlxrt.engine.memory import parse_size

        def given(name: str) -> Any:
            value = options.get(name)
            return ENGINE_DEFAULTS[name] if value is None else value

        budget = options.get("memory_budget")
        cache_bytes = options.get("prompt_cache_bytes")
        return cls(
            batch=max(int(given("batch")), 1),
            prompt_concurrency=max(int(given("prompt_concurrency")), 1),
            prefill_step_size=max(int(given("prefill_step_size")), 1),
            max_queue=max(int(given("max_queue")), 0),
            request_timeout=float(given("request_timeout")) or None,  # 0: no limit
            memory_budget=parse_size(budget, default_unit="GB") if budget is not None else None,
            prompt_cache_size=max(int(given("prompt_cache_size")), 0),
            prompt_cache_bytes=parse_size(cache_bytes) if cache_bytes is not None else None,
            adapter=options.get("adapter_path") or None,
            adapter_dirs=tuple(options.get("adapter_dir") or ()),
            kv_quant=options.get("kv_quant"),
            kv_bits=options.get("kv_bits"),
            kv_group_size=int(given("kv_group_size")),
            quantized_kv_start=options.get("quantized_kv_start"),
            draft_model=options.get("draft_model") or None,
            num_draft_tokens=max(int(given("num_draft_tokens")), 0),
            prompt_cache_dir=options.get("prompt_cache_dir") or None,
            prompt_cache_dir_bytes=_gb(given("prompt_cache_dir_size")),
        )
