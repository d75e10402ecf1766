"""Serving one model across several processes or machines with ``mlx.distributed``.

Every rank loads the same checkpoint and keeps its shard of it (mlx-lm's ``shard`` for
tensor parallelism, its ``pipeline`` for pipeline parallelism). Rank 0 serves HTTP with a
:class:`DistributedEngine`; every other rank runs :func:`follow` and never binds a port.
All model data, and the few integers that keep the ranks in step, travel through MLX's own
collectives (ring over TCP, MPI where installed); mlxrt adds no transport of its own.

The ranks stay in step with the small protocol of :mod:`mlxrt.distributed.lockstep`; rank 0's
engine takes the others as its peers (:class:`mlxrt.distributed.group.RankGroup`).

A peer that dies makes the ring backend raise (``connection to a peer was lost``); a peer
that hangs is caught by a watchdog thread when rank 0 has waited on the others past
``--distributed-timeout`` (per collective, per decode step, per prefill chunk). Either way rank 0 fails its requests with 503 and ``/health``
answers 503 from then on (the group cannot be rebuilt in-process).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.distributed.group import DistributedSettings, RankGroup, place, shard_model
from mlxrt.distributed.lockstep import JOB, SHUTDOWN, Lockstep, RankLost
from mlxrt.engine.config import EngineConfig
from mlxrt.engine.engine import Engine
from mlxrt.errors import InvalidRequest, MlxrtError

if TYPE_CHECKING:
    from mlxrt.engine.loader import ModelLoader
    from mlxrt.records import GenerationRequest, ModelInfo
    from mlxrt.registry import PluginHost

__all__ = ["DistributedSettings", "DistributedEngine", "refusals", "start", "shard_model", "follow", "make_engine"]

log = logging.getLogger("mlxrt.distributed.serving")

#: Seconds a rank keeps trying to reach the others at start-up.
JOIN_WAIT = 180.0


def refusals(options: dict[str, Any]) -> list[str]:
    """Why ``options`` cannot be served distributed (empty when they can)."""
    why = []
    if (options.get("batch") or 1) > 1:
        why.append("--batch > 1 (the distributed engine runs one request at a time)")
    if options.get("adapter_path") or options.get("adapter_dir"):
        why.append("--adapter / --adapter-dir (LoRA adapters)")
    if options.get("kv_quant") not in (None, "off") or options.get("kv_bits") is not None:
        why.append("--kv-quant / --kv-bits (quantized KV caches)")
    if options.get("draft_model"):
        why.append("--draft-model (speculative decoding)")
    if (options.get("max_models") or 1) > 1 or options.get("preload") or options.get("model_alias") \
            or options.get("idle_unload"):
        why.append("several models (--max-models, --preload, --model-alias, --idle-unload): every rank holds "
                   "a shard of the one served model")
    if options.get("prompt_cache_dir"):
        why.append("--prompt-cache-dir (the prompt cache is off when distributed)")
    return why


class DistributedEngine(Engine):
    """Rank 0's engine: the serial lane, in lockstep with the other ranks (its peers, a
    :class:`~mlxrt.distributed.group.RankGroup`).

    Refused at start-up (see :func:`refusals`): batching, adapters, quantized KV caches.
    The prompt cache is off (each rank's shard of a cache would have to be kept in step).
    Raw forwards (:meth:`Engine.call`: embeddings, adapter mounts) are refused with 400.
    """

    def __init__(self, host: PluginHost, config: EngineConfig, group: Any, settings: DistributedSettings, *,
                 loader: ModelLoader) -> None:
        if config.prompt_cache_size:
            log.info("prompt cache off: it is not kept across ranks (docs/distributed.md)")
        #: The other ranks: sharding, lockstep, heartbeat and the group's failure.
        self.ranks = RankGroup(group, settings, fail=self.fail_all)
        super().__init__(host, attrs.evolve(config, batch=1, prompt_cache_size=0), loader=loader, peers=self.ranks)
        self.group = group
        self.settings = settings
        self.lockstep = self.ranks.lockstep
        self._watchdog: threading.Thread | None = None

    @property
    def failure(self) -> str | None:
        """Why the group is lost, once it is (then every request gets 503)."""
        return self.ranks.failure

    @property
    def unhealthy(self) -> str | None:
        return self.failure

    def declare_failed(self, reason: str) -> None:
        """Mark the group lost and fail every waiting request (any thread; idempotent)."""
        self.ranks.declare_failed(reason)

    def load(self, info: ModelInfo) -> None:
        super().load(info)
        self._watchdog = threading.Thread(target=self.ranks.watch, args=(lambda: self.serving,),
                                          name="mlxrt-watchdog", daemon=True)
        self._watchdog.start()

    def generate(self, request: GenerationRequest) -> Any:
        if self.failure is not None:
            raise RankLost(self.failure)
        if getattr(request, "vision", None) is not None:
            raise InvalidRequest("image input is not available when the model is served distributed "
                                 "(--distributed); see docs/distributed.md", code="distributed_unsupported")
        return super().generate(request)

    def call_blocking(self, fn: Any) -> Any:
        # image splicing: the other ranks would run the prompt from its ids, not its embeddings
        raise InvalidRequest("image input is not available when the model is served distributed "
                             "(--distributed); see docs/distributed.md", code="distributed_unsupported")

    async def call(self, fn: Any) -> Any:
        raise InvalidRequest("not available when the model is served distributed (--distributed): only "
                             "text generation runs across ranks; see docs/distributed.md",
                             code="distributed_unsupported")

    def stop(self, *, timeout: float = 30.0) -> None:
        # With the group lost the worker may be stuck in a collective with a dead peer: do not
        # wait long (a stuck worker is not given back to the pool).
        super().stop(timeout=2 if self.failure is not None else timeout)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "distributed": {
            "ranks": self.group.size(), "mode": "pipeline" if self.settings.pipeline else "tensor",
            "failure": self.failure}}


# -- other ranks -------------------------------------------------------------------------------


def follow(host: PluginHost, info: ModelInfo, group: Any, settings: DistributedSettings) -> int:
    """A rank other than 0: load and shard the model, then run rank 0's items until it says
    ``SHUTDOWN`` (status 0) or is lost (status 1)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from mlxrt.loading import load_model

    # Rank 0 says when to stop (SHUTDOWN); a Ctrl-C reaching every rank of a terminal must not
    # end this one in the middle of a collective.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stream = mx.new_stream(mx.default_device())
    lockstep = Lockstep(group)
    status = 0
    with mx.stream(stream):
        try:
            loaded, _profile = load_model(info, host)
            place(loaded.model, group, settings)
            if loaded.engine == "autoregressive":
                from mlxrt.engine.memory import measure_kv

                # Rank 0's engine measures the KV cost with one forward as it sets up
                # (mlxrt.engine.worker_setup); the sharded forward has collectives, so every rank runs it.
                try:
                    measure_kv(loaded.model)
                except Exception:  # as the engine does: a model outside mlx-lm's cache protocol
                    log.debug("could not measure KV cost", exc_info=True)
            sampler = lockstep.sampler()
            while True:
                item = lockstep.receive()
                if item.kind == SHUTDOWN:
                    log.info("rank %d: shutdown from rank 0", group.rank())
                    break
                if item.kind != JOB or item.max_tokens <= 0:
                    continue
                steps = generate_step(mx.array(item.prompt), loaded.model, max_tokens=item.max_tokens,
                                      sampler=sampler, prompt_cache=make_prompt_cache(loaded.model),
                                      prefill_step_size=item.prefill_step_size, stream=stream)
                for _token, _logprobs in steps:
                    if lockstep.agree(False):
                        break
        except MlxrtError as exc:
            log.error("rank %d: %s", group.rank(), exc.message)
            status = 1
        except RuntimeError as exc:
            log.error("rank %d: lost rank 0 or a peer: %s", group.rank(), exc)
            status = 1
        except Exception:  # out of step with rank 0 from here on: leave, so that rank 0 notices
            log.exception("rank %d: generation failed; leaving the group", group.rank())
            status = 1
        mx.synchronize(stream)
    mx.clear_streams()
    return status


# -- start-up ---------------------------------------------------------------------------------


def _join(settings: DistributedSettings) -> Any:
    import mlx.core as mx

    # The ring backend gives up connecting to a peer after about 30 s, and a rank whose start-up
    # is slower than its peers' (a loaded machine, a cold disk) can take longer: try again.
    deadline = time.monotonic() + JOIN_WAIT
    while True:
        try:
            group = mx.distributed.init(strict=True, backend=settings.backend)
            break
        except RuntimeError as exc:
            if "connect" in str(exc).lower() and time.monotonic() < deadline:
                log.info("waiting for the other ranks (%s)", exc)
                continue
            raise ValueError(f"cannot join an mlx.distributed group ({settings.backend} backend): {exc}. Start "
                             "every rank with mlx.launch or `mlxrt launch` (docs/distributed.md)") from None
    if group.size() < 2:
        raise ValueError("--distributed: the group has one rank; start the ranks with mlx.launch or "
                         "`mlxrt launch --hosts h1,h2 -- serve MODEL ...`")
    return group


def make_engine(host: PluginHost, config: EngineConfig, opts: dict[str, Any], *,
                loader: ModelLoader) -> DistributedEngine:
    """Rank 0's engine for ``mlxrt serve --distributed`` (after :func:`start`)."""
    settings = DistributedSettings.from_options(opts)
    return DistributedEngine(host, config, _join(settings), settings, loader=loader)


def start(host: PluginHost, model: str | None, opts: dict[str, Any]) -> Any:
    """``mlxrt serve --distributed``: join the group. On rank 0 returns the group (the caller
    then builds a :class:`DistributedEngine` and serves HTTP); on any other rank runs
    :func:`follow` and exits the process with its status.

    :raises ValueError: Options that cannot be served distributed, or no group to join.
    """
    why = refusals(opts)
    if why:
        raise ValueError("not supported with --distributed: " + "; ".join(why) + " (docs/distributed.md)")
    settings = DistributedSettings.from_options(opts)
    group = _join(settings)
    if group.rank() == 0:
        return group
    from mlxrt.loading.resolve import read_model_info, resolve_model

    host.options.update(opts)
    try:
        info = read_model_info(resolve_model(model, allow_download=False))
        status = follow(host, info, group, settings)
    except MlxrtError as exc:
        log.error("rank %d: %s", group.rank(), exc.message)
        status = 1
    sys.exit(status)
