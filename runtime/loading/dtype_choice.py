"""``--dtype``: which dtype the weights are served in, and why.

``auto`` (the default) serves a quantized, bfloat16 or float16 checkpoint as float32 when all
of these hold, and keeps the stored dtype otherwise:

* MLX runs on the CPU (on Metal/CUDA the stored dtype is what the GPU kernels are fast at);
* a fast BLAS is active (:mod:`mlxrt.loading.blas`: the system OpenBLAS or MKL). Only float32 matmuls
  go through BLAS; on the bundled reference BLAS float32 is no faster than the stored dtype;
* the float32 weights plus the float32 KV cache of one request at the default context
  (:data:`mlxrt.loading.sizes.DEFAULT_CONTEXT` tokens, capped at the model's context window) fit in the
  usable memory budget: ``--memory-budget`` (or :func:`mlxrt.loading.sizes.machine_budget`, a share of
  physical memory), divided among ``--max-models``, less :data:`mlxrt.engine.memory.MARGIN`;
* every quantized layer is of a kind mlx-lm can dequantize, and the weights are not loaded
  lazily for ``--distributed`` (casting would read every shard on every rank);
* and, where the mlxrt-qmv kernel is installed (:mod:`mlxrt.engine.qmv`) and the model has
  layers it computes, float32 is faster by measurement: :func:`time_paths` times, at load, one
  decode step's products of the model's own matrices — the kernel on the stored weights against
  float32 matrices of the same shapes through the BLAS — and ``auto`` keeps the stored weights
  when the kernel is faster (a quantized model is then also smaller and starts sooner). Without
  the model loaded (``mlxrt fit``, ``GET /fit``) nothing can be timed: where the kernel is active
  and the checkpoint's quantized layers are of the kinds it computes (affine 4/8-bit, group
  size 32/64/128, :func:`kernel_computes`), the static rule predicts what the measurement
  finds on every model measured so far, the kernel (SmolLM2: 21.6 ms a token against 121 ms as
  float32), so ``fit``, ``/fit``, ``/stats`` and the start line name the same dtype.

An explicit ``--dtype float32|bfloat16|float16`` casts as asked; ``--dtype stored`` never casts.

The rule is :func:`decide`, on :class:`DtypeFacts`. At load, :func:`choose_dtype` takes the facts
from the loaded model; ``mlxrt fit`` and ``GET /fit`` (:func:`mlxrt.loading.fit.assess`) take them
from the safetensors headers (:func:`static_facts`) and the machine from :func:`machine_facts`,
so the fit verdict is that of the dtype ``mlxrt serve`` would serve. The static facts cannot
see a quantized layer of a kind mlx-lm cannot dequantize: the load-time choice then keeps the
stored dtype where the static one said float32; and a load whose measurement, against every
one so far, found float32 faster serves float32 where the static rule predicted the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.records import ModelInfo

if TYPE_CHECKING:
    from mlxrt.loading.blas import BlasStatus

__all__ = ["DtypeChoice", "DtypeFacts", "Machine", "Timing", "time_paths", "decide", "choose_dtype", "static_facts", "machine_facts",
           "blas_name", "stored_dtype", "float32_bytes", "kernel_computes", "DTYPES", "CAST_BYTES"]

#: What ``--dtype`` accepts.
DTYPES = ("auto", "float32", "bfloat16", "float16", "stored")
#: Bytes per element of the dtypes ``--dtype`` may cast to.
CAST_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@attrs.frozen
class DtypeFacts:
    """What the ``auto`` rule weighs about one model: its ``stored`` dtype (as
    :func:`stored_dtype` names it), the bytes of its weights as float32, the bytes of one
    request's float32 KV cache at ``ctx`` tokens (the default context, capped at the model's
    window), and the first quantized layer mlx-lm cannot dequantize (``None``: none, or not known)."""

    stored: str
    float32_bytes: int
    kv_bytes: int
    ctx: int
    undequantizable: str | None = None
    #: The quantized layers are all of kinds the mlxrt-qmv kernel computes (:func:`kernel_computes`).
    kernel_layers: bool = False


@attrs.frozen
class Machine:
    """Where the weights would be served: on the CPU or a GPU, with a fast BLAS or not, and
    the mlxrt-qmv kernel's name where it is active (``None``: not installed or not usable)."""

    on_cpu: bool
    blas_fast: bool
    blas_name: str
    kernel: str | None = None


@attrs.frozen
class DtypeChoice:
    """The weights' dtype: ``stored`` (what the checkpoint holds, e.g. ``bfloat16`` or
    ``quantized 4-bit``), ``cast`` (the dtype they were cast to, ``None`` when kept as stored),
    ``requested`` (``--dtype``) and ``reason`` (why, in words)."""

    requested: str
    stored: str
    cast: str | None
    reason: str

    @property
    def served(self) -> str:
        return self.cast or self.stored

    def __str__(self) -> str:
        return f"{self.served} ({self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return {"served": self.served, "stored": self.stored, "cast": self.cast,
                "requested": self.requested, "reason": self.reason, "text": str(self)}


@attrs.frozen
class Timing:
    """One decode step's products of a model's quantized matrices, measured at load: through the
    mlxrt-qmv ``kernel`` on the stored weights (``kernel_s``) and as float32 through the BLAS
    (``float32_s``), in seconds."""

    kernel_s: float
    float32_s: float
    kernel: str
    #: Why the kernel is the faster without timing it (:func:`mlxrt.engine.qmv.known_faster`);
    #: then the two times are not measured (0 and infinity).
    known: str = ""

    @property
    def text(self) -> str:
        if self.known:
            return self.known
        return (f"measured at load: a token's matrices {self.kernel_s * 1e3:.1f} ms with the mlxrt-qmv kernel "
                f"({self.kernel}), {self.float32_s * 1e3:.1f} ms as float32")


#: Float32 elements the float32 timing streams through (64 MB, more than a CPU's last-level
#: cache, so the matrices come from memory as a whole model's do); also the largest matrix it
#: builds: a bigger one is timed on its first rows and scaled.
_TIMING_ELEMENTS = 16 * 1024 * 1024


def time_paths(model: Any, module: Any, *, rounds: int = 3, known: str = "") -> Timing | None:
    """Time one row through every matrix the kernel would compute (``None``: there is none): the
    kernel ``module`` (``mlxrt_qmv``) on the stored weights themselves, and float32 matrices of
    the same shapes (views of one 64 MB buffer, so cheap to build) through the BLAS, each the best
    of ``rounds`` taken in turn after a warm-up. The tied output head (a quantized embedding's ``as_linear``)
    counts when the model has no ``lm_head`` module. ~0.2 s for SmolLM2-135M. ``known``: why the
    kernel is known faster (:func:`mlxrt.engine.qmv.known_faster`): then nothing is timed."""
    import time
    from collections import Counter

    import mlx.core as mx
    import mlx.nn as nn

    from mlxrt.engine.qmv import eligible

    modules = dict(model.named_modules())
    tied = not any(name == "lm_head" or name.endswith(".lm_head") for name in modules)
    layers = [m for m in modules.values() if eligible(m) and (
        isinstance(m, nn.QuantizedLinear) or (tied and isinstance(m, nn.QuantizedEmbedding)))]
    if not layers:
        return None
    if known:
        return Timing(0.0, float("inf"), module.kernel_name(), known)

    def in_dim(layer: Any) -> int:
        return layer["weight"].shape[1] * 32 // layer.bits

    def timed(run: Any) -> float:
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0

    xs = {(k, layer["scales"].dtype): mx.ones((1, k), dtype=layer["scales"].dtype)
          for layer in layers for k in [in_dim(layer)]}

    def kernel_pass() -> None:
        mx.eval([module.quantized_matmul(xs[in_dim(m), m["scales"].dtype], m["weight"], m["scales"], m["biases"],
                                         m.group_size, m.bits) for m in layers])

    buf = mx.ones((_TIMING_ELEMENTS,), dtype=mx.float32)
    mx.eval(buf)
    float32_runs = []  # (run, seconds of one run -> seconds of the model's matrices of that shape)
    for (n, k), count in Counter((m["weight"].shape[0], in_dim(m)) for m in layers).items():
        rows = min(n, max(1, _TIMING_ELEMENTS // k))
        copies = max(1, min(count, _TIMING_ELEMENTS // (rows * k)))
        mats = [buf[i * rows * k:(i + 1) * rows * k].reshape(rows, k) for i in range(copies)]
        x = mx.ones((1, k), dtype=mx.float32)
        float32_runs.append((lambda x=x, mats=mats: mx.eval([x @ w.T for w in mats]), n / rows * count / copies))

    def float32_pass() -> float:
        return sum(timed(run) * scale for run, scale in float32_runs)

    # Warm up both, then alternate them, so that a burst of other load on the machine hits both.
    kernel_pass()
    float32_pass()
    kernel_s = float32_s = float("inf")
    for _ in range(rounds):
        kernel_s = min(kernel_s, timed(kernel_pass))
        float32_s = min(float32_s, float32_pass())
    del buf
    return Timing(kernel_s, float32_s, module.kernel_name())


def _quantized_bits(model: Any) -> list[int]:
    return sorted({int(m.bits) for _name, m in model.named_modules() if "scales" in m and hasattr(m, "bits")})


def stored_dtype(model: Any) -> str:
    """``quantized N-bit`` when any layer is quantized, else the float dtype holding the most
    parameters (``float32``, ``bfloat16``, ``float16``)."""
    from mlx.utils import tree_flatten

    bits = _quantized_bits(model)
    if bits:
        return f"quantized {'/'.join(map(str, bits))}-bit"
    sizes: dict[str, int] = {}
    for _name, p in tree_flatten(model.parameters()):
        name = str(p.dtype).removeprefix("mlx.core.")
        if name in ("float32", "bfloat16", "float16", "float64"):
            sizes[name] = sizes.get(name, 0) + p.size
    return max(sizes, key=sizes.__getitem__) if sizes else "float32"


def float32_bytes(model: Any) -> int:
    """Bytes of the weights once dequantized and cast to float32 (packed quantized weights
    count their unpacked elements; scales and biases of quantization go away)."""
    from mlx.utils import tree_flatten

    total = 0
    for _prefix, module in model.named_modules():
        quantized = "scales" in module and hasattr(module, "bits")
        for name, p in tree_flatten(module.parameters()):
            if "." in name:  # a child module's: counted with the child
                continue
            if quantized and name in ("scales", "biases"):
                continue
            total += p.size * 32 // int(module.bits) if quantized and name == "weight" else p.size
    return 4 * total


def _undequantizable(model: Any) -> list[str]:
    import mlx.nn as nn
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)
    return [name for name, m in model.named_modules() if "scales" in m and not isinstance(m, kinds)]


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**9 else f"{n / 1e6:.1f} MB"


def _float32_kv(config: Any, window: int | None) -> tuple[int, int]:
    """Context and bytes of one request's float32 KV cache at the default context."""
    from mlxrt.errors import ModelLoadError
    from mlxrt.loading.sizes import DEFAULT_CONTEXT, static_kv

    ctx = min(DEFAULT_CONTEXT, window) if window and window > 0 else DEFAULT_CONTEXT
    try:
        kv = static_kv(config, 4)
    except ModelLoadError:  # no attention shape in the config: the weights alone decide
        return ctx, 0
    return ctx, kv.per_token * ctx + kv.fixed


def decide(requested: str, facts: DtypeFacts, machine: Machine, *, budget: int | None, lazy: bool = False,
           models: int = 1, timing: Callable[[], Timing | None] | None = None) -> DtypeChoice:
    """The rule of the module docstring: what ``--dtype requested`` serves for a model with these
    ``facts`` on this ``machine``; ``budget`` is ``--memory-budget`` in bytes (``None``: a share
    of physical memory), shared by ``models`` resident models (``--max-models``) as the model
    pool shares it; ``timing`` (called only when float32 would otherwise be chosen) measures the
    kernel against float32 (:func:`time_paths`; ``None``: no kernel, the rule alone decides)."""
    stored = facts.stored
    if requested in CAST_BYTES:
        return DtypeChoice(requested, stored, requested, f"--dtype {requested}")
    if requested == "stored":
        return DtypeChoice(requested, stored, None, "--dtype stored")
    keep = "auto keeps the stored dtype"
    if stored == "float32":
        return DtypeChoice(requested, stored, None, "auto: stored as float32")
    if not machine.on_cpu:
        return DtypeChoice(requested, stored, None, f"{keep} on a GPU")
    if not machine.blas_fast:
        return DtypeChoice(requested, stored, None,
                           f"{keep}: no fast BLAS ({machine.blas_name}), float32 would be no faster")
    if lazy:
        return DtypeChoice(requested, stored, None, f"{keep}: --distributed loads the weights lazily")
    if facts.undequantizable:
        return DtypeChoice(requested, stored, None, f"{keep}: mlx-lm cannot dequantize {facts.undequantizable}")
    from mlxrt.engine.memory import MARGIN
    from mlxrt.loading.sizes import machine_budget

    weights, kv_bytes = facts.float32_bytes, facts.kv_bytes
    source = "--memory-budget" if budget is not None else "a share of RAM"
    if models > 1:
        source += f" / --max-models {models}"
    usable = int((budget if budget is not None else machine_budget()) // max(models, 1) * (1 - MARGIN))
    need = f"float32 weights {_gb(weights)} + KV for {facts.ctx} tokens {_gb(kv_bytes)}"
    if weights + kv_bytes > usable:
        return DtypeChoice(requested, stored, None, f"{keep}: {need} exceed {_gb(usable)} ({source})")
    measured = timing() if timing is not None else None
    if measured is not None and measured.kernel_s <= measured.float32_s:
        return DtypeChoice(requested, stored, None, f"{keep}, the faster: {measured.text}")
    if timing is None and machine.kernel is not None and facts.kernel_layers:  # nothing loaded to time
        return DtypeChoice(requested, stored, None,
                           f"{keep}, the faster: the mlxrt-qmv kernel ({machine.kernel}) computes its quantized "
                           "layers (serve measures it at load)")
    return DtypeChoice(requested, stored, "float32",
                       f"auto: CPU with {machine.blas_name}; {need} fit in {_gb(usable)} ({source})"
                       + (f"; the faster: {measured.text}" if measured is not None else ""))


def choose_dtype(requested: str, model: Any, info: ModelInfo, *, budget: int | None, blas_fast: bool,
                 blas_name: str, on_cpu: bool, lazy: bool = False, models: int = 1,
                 kernel: Any = None) -> DtypeChoice:
    """What ``--dtype requested`` means for this loaded ``model``: :func:`decide` on the facts
    the model itself gives, with :func:`time_paths` when the mlxrt-qmv ``kernel`` module is given."""
    ctx, kv_bytes = _float32_kv(info.config, info.context_window)
    left = _undequantizable(model)
    facts = DtypeFacts(stored_dtype(model), float32_bytes(model), kv_bytes, ctx, left[0] if left else None)
    from mlxrt.engine.qmv import known_faster

    known = known_faster(kernel) if kernel is not None else ""
    timing = (lambda: time_paths(model, kernel, known=known)) if kernel is not None else None
    return decide(requested, facts, Machine(on_cpu, blas_fast, blas_name), budget=budget, lazy=lazy, models=models,
                  timing=timing)


def static_facts(config: Any, summary: Any, window: int | None) -> DtypeFacts:
    """The facts from a folder's ``config.json`` and safetensors headers
    (:class:`mlxrt.loading.sizes.WeightsSummary`), nothing loaded: packed quantized weights count
    their unpacked elements, as :func:`float32_bytes` counts them; ``window`` is the model's
    context window."""
    ctx, kv_bytes = _float32_kv(config, window)
    return DtypeFacts(summary.stored_dtype, 4 * summary.params, kv_bytes, ctx,
                      kernel_layers=summary.stored_dtype.startswith("quantized") and kernel_computes(config))


def kernel_computes(config: Any) -> bool:
    """Whether every quantization a checkpoint's ``config.json`` declares (the default and each
    per-layer override) is one the mlxrt-qmv kernel computes: affine, 4 or 8 bits, group size
    32, 64 or 128 (:func:`mlxrt.engine.qmv.eligible`, for a loaded layer)."""
    quant = config.get("quantization") or config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(quant, dict):
        return False
    specs = [quant, *(v for v in quant.values() if isinstance(v, dict))]
    return all(spec.get("mode", "affine") == "affine" and spec.get("bits") in (4, 8)
               and spec.get("group_size") in (32, 64, 128) for spec in specs)


def machine_facts(blas: BlasStatus | None = None) -> Machine:
    """This process's device and ``blas`` (default: the BLAS an ``mlxrt`` command would run on,
    :func:`mlxrt.loading.blas.expected`; a running server passes its own, ``current()``)."""
    import mlx.core as mx

    import mlxrt.engine.qmv as qmv
    from mlxrt.loading.blas import expected

    blas = blas if blas is not None else expected()
    kernel = qmv.status()
    return Machine(on_cpu=mx.default_device() == mx.cpu, blas_fast=blas.fast, blas_name=blas_name(blas.kind),
                   kernel=kernel.kernel if kernel.active else None)


def blas_name(kind: str) -> str:
    """How the ``auto`` reason names a BLAS kind."""
    return {"openblas": "OpenBLAS", "mkl": "MKL"}.get(kind, "bundled")
