"""Model loading: a model folder becomes a loaded model (weights in MLX, cast to the served
dtype, on the kernel where it runs) with its :class:`~mlxrt.records.FamilyProfile`.

The room's other modules hold the steps before and around it: where the folder comes from
(:mod:`mlxrt.loading.resolve`, downloads, the library, GGUF conversion, the embedded model),
the checkpoint's weights (:mod:`~mlxrt.loading.weights`), the folder checks, the static fit and
the served dtype, the BLAS of MLX's CPU backend (:mod:`~mlxrt.loading.blas`), and the images a
request brings (:mod:`~mlxrt.loading.images`, spliced by :mod:`~mlxrt.loading.vision`). Imports
run one way: loading may use the engine's public pieces (the kernel, memory sizes); the engine
never imports loading, it is handed a :class:`Loader` (:class:`mlxrt.engine.loader.ModelLoader`).

Plugins import :func:`mlx_lm_load` from here (``mlxrt.loading.mlx_lm_load``: a stable path).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.errors import ModelLoadError
from mlxrt.records import FamilyProfile, LoadedModel, ModelInfo, ToolStreamMode

if TYPE_CHECKING:
    from collections.abc import Callable

    from mlxrt.registry import PluginHost

__all__ = [
    "Loader",
    "load_model",
    "load_draft",
    "load_weights",
    "mlx_lm_load",
    "resolve_profile",
    "cast_weights",
    "with_tool_prompt",
    "with_replaced_template",
]

log = logging.getLogger("mlxrt.loading")


def mlx_lm_load(info: ModelInfo, classes: tuple[type, type] | None = None, *,
                trust_remote_code: bool = False, lazy: bool = False,
                prepare: Callable[[Any], None] | None = None) -> LoadedModel:
    """Load ``info`` with mlx-lm; ``classes=(Model, ModelArgs)`` supplies an architecture
    mlx-lm lacks (the family's own model code). ``trust_remote_code`` lets the tokenizer's
    own code from the model folder run (``--trust-remote-code``). ``lazy`` leaves the weights
    unread until evaluated (``--distributed``: each rank reads only its shard). ``prepare`` is
    called with the model once it is built, its weights not yet read: what it computes from them
    (the kernel's layouts) is computed in the same read, beside the tokenizer's build."""
    from concurrent.futures import ThreadPoolExecutor

    from mlxrt.loading.weights import eos_token_ids, load_architecture_and_weights
    from mlxrt.text.tokenizer import load_tokenizer

    # The tokenizer loads on a thread of its own while the weights are read. Building a tokenizer
    # holds the GIL throughout (Gemma 3's 262K-token one: ~0.6 s in tokenizers' Rust), so it starts
    # only once the model is built and its weights are mapped (Python: imports, modules), and runs
    # beside MLX's read of them, which releases the GIL: started first, it left every import of
    # the weights' side waiting for it.
    try:
        model, _config = load_architecture_and_weights(info.path, classes=classes, lazy=True)
        if prepare is not None:
            prepare(model)
        parameters = model.parameters() if not lazy else None
        with ThreadPoolExecutor(1, thread_name_prefix="mlxrt-tokenizer") as pool:
            tokenizing = pool.submit(load_tokenizer, info.path, eos_token_ids=eos_token_ids(info.path),
                                     trust_remote_code=trust_remote_code)
            if parameters is not None:
                import mlx.core as mx

                mx.eval(parameters)
            tokenizer = tokenizing.result()
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise ModelLoadError(f"mlx-lm could not load {info.model_id}: {exc}") from exc
    return LoadedModel(model=model, tokenizer=tokenizer)


def cast_weights(model: Any, dtype: str, *, model_id: str = "model") -> None:
    """``--dtype``: dequantize ``model``'s quantized layers, then cast every floating weight
    to ``dtype`` (``float32``, ``bfloat16`` or ``float16``), in place.

    On a Linux CPU with a fast BLAS (system OpenBLAS or MKL), float32 is the fast path: only
    fp32 matmuls go through BLAS (docs/performance.md); ``--dtype auto`` picks it there.

    :raises ModelLoadError: A quantized layer mlx-lm cannot dequantize is left.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    def quantized_layers() -> list[str]:
        return sorted({name.rsplit(".", 1)[0] for name, _ in tree_flatten(model.parameters())
                       if name.endswith(".scales")})

    if quantized_layers():  # mlxrt's copy of mlx-lm's, without mlx_lm.utils (transformers)
        from mlxrt.loading.weights import dequantize_model

        dequantize_model(model)
    left = quantized_layers()
    if left:
        raise ModelLoadError(f"--dtype {dtype}: cannot dequantize {model_id}: quantized layers "
                             f"{', '.join(left[:3])}{' …' if len(left) > 3 else ''} are of a kind mlx-lm "
                             "cannot dequantize; serve it without --dtype")
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    log.info("weights of %s cast to %s", model_id, dtype)


def resolve_profile(info: ModelInfo, host: PluginHost, model: object = None) -> FamilyProfile:
    """Ask every family hook once and freeze the answers, with who gave each (``model``: the
    served model being loaded, given to ``mlxrt_vision``)."""
    provenance: dict[str, str] = {}

    def ask(aspect: str, hook: str, **kwargs: Any) -> Any:
        plugin, value = host.first_answer(hook, **kwargs)
        if plugin is not None:
            provenance[aspect] = plugin
        return value

    thinking = ask("thinking_format", "mlxrt_thinking_format", info=info)
    parser = ask("tool_parser", "mlxrt_tool_parser", info=info)
    plain = ask("tool_stream_mode", "mlxrt_tool_stream_mode", info=info, has_tools=False)
    with_tools = ask("tool_stream_mode_with_tools", "mlxrt_tool_stream_mode", info=info, has_tools=True)
    vision = ask("vision", "mlxrt_vision", info=info, host=host, model=model)
    return FamilyProfile(
        info=info,
        thinking_format=thinking,
        tool_parser=parser,
        tool_stream_mode=ToolStreamMode(plain) if plain else ToolStreamMode.PLAIN,
        tool_stream_mode_with_tools=ToolStreamMode(with_tools) if with_tools else ToolStreamMode.BUFFERED_TEXT,
        vision=vision,
        provenance=provenance,
    )


def with_tool_prompt(profile: FamilyProfile, tokenizer: Any, host: PluginHost) -> FamilyProfile:
    """``profile`` with a :class:`~mlxrt.records.ToolPrompt` when the model's chat template
    renders no tools (``mlxrt_tool_prompt``, else mlxrt's generic one unless a family gave its
    own parser): its parser reads the calls and buffers them while streaming."""
    from mlxrt.text.generic_tools import GenericToolPrompt, template_renders_tools

    if template_renders_tools(tokenizer):
        return profile
    plugin, prompt = host.first_answer("mlxrt_tool_prompt", info=profile.info)
    if prompt is None:
        if profile.tool_parser is not None:  # the family reads its model's calls its own way
            return profile
        prompt, plugin = GenericToolPrompt(), None
    with_tools = profile.tool_stream_mode_with_tools
    if with_tools is ToolStreamMode.PLAIN:
        with_tools = ToolStreamMode.BUFFERED_TEXT
    # mlxrt's own prompt is no family's answer: the model stays in its tier and family
    provenance = {**profile.provenance, "tool_prompt": plugin or "default"}
    if plugin is not None:
        provenance["tool_parser"] = plugin
    return attrs.evolve(profile, tool_prompt=prompt, tool_parser=prompt.parser, tool_stream_mode_with_tools=with_tools,
                        provenance=provenance)


def with_replaced_template(profile: FamilyProfile, tokenizer: Any) -> FamilyProfile:
    """``profile`` once ``--chat-template`` replaced the model's template: a template that renders
    tools itself renders them, in place of the tool prompt :func:`with_tool_prompt` gave a model
    whose own template rendered none (its parser still reads the calls: mlxrt's generic one
    reads the common ``<tool_call>`` JSON markup)."""
    from mlxrt.text.generic_tools import template_renders_tools

    if profile.tool_prompt is None or not template_renders_tools(tokenizer):
        return profile
    return attrs.evolve(profile, tool_prompt=None)


def load_weights(info: ModelInfo, host: PluginHost) -> tuple[LoadedModel, str | None]:
    """The model and tokenizer through the family hooks (mlx-lm when none answers), cast as
    ``--dtype`` says (default ``auto``, :mod:`mlxrt.loading.dtype_choice`); with the name of the plugin
    that loaded it (``None``: mlx-lm). The folder is checked first
    (:func:`mlxrt.loading.folder_check.check_model_folder`: weights present, their dtypes,
    finite norms and scales; once loaded, a vocabulary that covers the tokenizer)."""
    from mlxrt.loading.folder_check import check_model_folder, check_vocabulary

    check_model_folder(info.path)
    plugin, loaded = host.first_answer("mlxrt_load_model", info=info, host=host)
    lazy = bool(host.options.get("distributed"))
    chosen: list[Any] = []
    if loaded is None:
        # the dtype chosen and the kernel installed before the weights are read, so that the
        # layouts it makes (bands of rows) are made in that read, beside the tokenizer's build
        loaded = mlx_lm_load(info, trust_remote_code=bool(host.options.get("trust_remote_code")), lazy=lazy,
                             prepare=None if lazy else lambda model: chosen.append(
                                 _prepare(model, info, host, lazy=False, evaluate=False)))
    check_vocabulary(info.path, loaded.tokenizer)
    choice = chosen[0] if chosen else _prepare(loaded.model, info, host, lazy=lazy)
    return attrs.evolve(loaded, dtype=choice), plugin


def _prepare(model: Any, info: ModelInfo, host: PluginHost, *, lazy: bool, evaluate: bool = True) -> Any:
    """The dtype ``model`` is served in (cast to it where it says so), and the kernel's layers
    installed where it runs; the choice (``None``: a plugin's own model object). ``evaluate=False``:
    the layers' new arrays are left for the caller's read of the weights."""
    choice = _choose_dtype(model, info, host, lazy=lazy)
    if choice is not None and choice.cast:
        cast_weights(model, choice.cast, model_id=info.model_id)
    if choice is not None and not lazy:
        import mlxrt.engine.qmv as qmv

        if not choice.cast and (count := _install_kernel(model, info, evaluate=evaluate)):
            log.info("%d quantized layers of %s run on the %s", count, info.model_id, qmv.status().text)
        if (count := qmv.install_fused(model)):
            log.info("%d norm and rotary layers of %s (and its attention and gated activation) run on "
                     "the %s fused primitives", count, info.model_id, qmv.status().text)
    return choice


def _install_kernel(model: Any, info: ModelInfo, *, evaluate: bool = True) -> int:
    """:func:`mlxrt.engine.qmv.install`, with what it found in these weights at an earlier start
    (:mod:`mlxrt.loading.kernel_plans`), and what it finds now kept for the next."""
    import mlxrt.engine.qmv as qmv
    from mlxrt.loading.kernel_plans import read_plan, write_plan

    st = qmv.load()
    if not st.active:
        return 0
    known = read_plan(info.path, qmv.API)
    found: dict[str, qmv.ScalesPlan] = {}
    count = qmv.install(model, st, known=known, found=found, evaluate=evaluate)
    if found and found != known:
        write_plan(info.path, qmv.API, found)
    return count


def _choose_dtype(model: Any, info: ModelInfo, host: PluginHost, *, lazy: bool) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    import mlxrt.engine.qmv as qmv
    from mlxrt.engine.memory import parse_size
    from mlxrt.loading.blas import current
    from mlxrt.loading.dtype_choice import blas_name, choose_dtype

    if not isinstance(model, nn.Module):  # a plugin's own model object: nothing to cast
        return None
    budget = host.options.get("memory_budget")
    blas = current()
    return choose_dtype(host.options.get("dtype") or "auto", model, info,
                        budget=parse_size(budget, default_unit="GB") if budget is not None else None,
                        blas_fast=blas.fast, blas_name=blas_name(blas.kind),
                        on_cpu=mx.default_device() == mx.cpu, lazy=lazy,
                        models=int(host.options.get("max_models") or 1), kernel=qmv.status().module)


def load_model(info: ModelInfo, host: PluginHost, model: object = None) -> tuple[LoadedModel, FamilyProfile]:
    """Load the model through the family hooks (mlx-lm when none answers) and resolve its
    profile (``model``: the served model being loaded, for the hooks that are given it)."""
    loaded, plugin = load_weights(info, host)
    profile = resolve_profile(info, host, model)
    profile = attrs.evolve(profile, provenance={"load_model": plugin or "mlx-lm", **profile.provenance})
    profile = with_tool_prompt(profile, loaded.tokenizer, host)
    from mlxrt.loading.self_test import run_self_test

    return loaded, attrs.evolve(profile, self_test=run_self_test(profile, loaded.tokenizer))




def load_draft(model: str, host: PluginHost) -> tuple[LoadedModel, ModelInfo]:
    """``--draft-model``: resolved (downloaded when missing) and loaded like the served model,
    but without a family profile (a draft only proposes tokens)."""
    from mlxrt.loading.resolve import read_model_info, resolve_model

    info = read_model_info(resolve_model(model, allow_download=True))
    draft, _plugin = load_weights(info, host)
    return draft, info


@attrs.frozen
class Loader:
    """Model loading as an engine is handed it (:class:`mlxrt.engine.loader.ModelLoader`): the
    engine runs these on its worker thread without importing this package."""

    def load(self, info: ModelInfo, host: PluginHost, model: object = None) -> tuple[LoadedModel, FamilyProfile]:
        return load_model(info, host, model)

    def load_draft(self, model: str, host: PluginHost) -> tuple[LoadedModel, ModelInfo]:
        return load_draft(model, host)
