"""The mlxrt-qmv kernel, when installed: quantized linear layers that read their packed weights
at memory bandwidth on the CPU.

``mlxrt-qmv`` (``kernels/mlxrt-qmv``, a separate distribution that ``scripts/setup`` builds where
a compiler exists) adds custom MLX primitives for ``x @ dequantize(w).T`` (any number of rows
of ``x`` with its default 8-bit activations, at most 32 on the exact path,
``MLXRT_QMV_EXACT=1``) and for ``dequantize``, on 4- or 8-bit affine weights with group sizes
32/64/128. MLX's own CPU ``quantized_matmul`` reads 4-bit weights at ~1 GB/s, and slower
still with more rows (docs/performance.md, "Quantized decode on the CPU").

:func:`status` says whether the kernel can be used in this process (installed, built for this
MLX, of exactly this mlxrt's :data:`API` version, MLX on the CPU; ``MLXRT_QMV=0`` turns it off) and is what ``mlxrt --version``, the start
line and ``GET /stats`` report. :func:`install` replaces a model's eligible quantized layers
(through MLX's ``Module.update_modules``) by instances of subclasses whose forward calls the kernel (more than ``MAX_ROWS`` rows in pieces, up to
:data:`KERNEL_ROWS`), or for more rows (a long prompt's prefill) multiplies by the kernel's
dequantized weights through the BLAS; without the kernel nothing changes.

:func:`install_fused` does the same for the operations between the products: MLX's CPU backend
has no kernel for ``mx.fast.rms_norm``, ``mx.fast.rope`` or ``mx.fast.scaled_dot_product_attention``
and runs each as its fallback graph (~8, ~40 and ~12 small ops), so a decode step of a 30-layer
model dispatched ~3,500 ops, most of its time. The kernel's fused primitives compute each as one
op (float32 on the CPU; anything else goes on to ``mx.fast`` itself). mlx-lm's ``swiglu``
(``silu(gate) * x``) goes through the kernel's too: MLX's CPU sigmoid runs one element at a time
through a software fma on x86-64 (~1 ms a layer for a 32-token prefill chunk of SmolLM2); the
primitive gives the same bits eight at a time. Gemma 2 and 3's MLPs (``gelu_approx(gate) * up``, which
MLX's CPU backend runs one element at a time through libm's ``powf`` and ``tanhf``) take the
kernel's ``geglu``: not MLX's bits but within a stated bound of them (docs/performance.md, "A
vectorized GELU"), so not on the exact path (``MLXRT_QMV_EXACT=1``), and ``MLXRT_QMV_GELU=0`` turns
it off. :func:`log_softmax` is the log-probabilities both
lanes draw each token from, through the kernel's one-op primitive (MLX's bits; MLX's CPU
``logsumexp`` takes its exponentials one at a time, 0.8 ms a row of a 49K vocabulary).

Where the kernel reads weights in bands of rows (``mlxrt_qmv.BAND_BITS``: every width with the
AVX-512 VNNI kernel), :func:`install` lays those layers' weights, scales and biases out so
(``band_rows``, in place where nothing else holds them): a batch's products take a third of the
float work, a lone row's are no slower (docs/performance.md, "Weights in bands of 16 rows").
Such a layer's arrays are not MLX's layout: it computes only through the kernel (an 8-bit
embedding's lookup reads the bands; a narrower embedding stays row-major), and
``MLXRT_QMV_BANDS=0`` keeps every layer row-major.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

__all__ = ["API", "QmvStatus", "status", "install", "install_fused", "eligible", "load", "accept", "log_softmax", "draw",
           "top_p_filter", "rows_invariant", "known_faster", "geglu_routed"]

log = logging.getLogger("mlxrt.engine.qmv")

#: The one mlxrt-qmv interface version this mlxrt uses (the kernel's ``mlxrt_qmv.API``): every
#: primitive and attribute below is there at exactly this version, so nothing probes for names.
#: ``scripts/setup`` builds the kernel from the same checkout; another version (an older wheel
#: left in the environment) is not used, with one warning saying to rebuild it.
API = 9


@attrs.frozen
class QmvStatus:
    """Whether the kernel is usable (``module`` is ``mlxrt_qmv`` then), which one this CPU
    runs (``kernel``), on how many threads, and why not when it is not (``reason``)."""

    module: Any = attrs.field(default=None, eq=False, repr=False)
    kernel: str | None = None
    threads: int = 0
    version: str | None = None
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.module is not None

    @property
    def text(self) -> str:
        if self.active:
            return f"mlxrt-qmv {self.version} ({self.kernel}, {self.threads} threads)"
        return f"none ({self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return {"active": self.active, "kernel": self.kernel, "threads": self.threads, "version": self.version,
                "reason": self.reason or None, "text": self.text}


_status: QmvStatus | None = None


def load() -> QmvStatus:
    """Import the kernel once per process (later calls return the same answer)."""
    global _status
    if _status is None:
        _status = _load()
    return _status


status = load


def _load() -> QmvStatus:
    if os.environ.get("MLXRT_QMV", "") in ("0", "off", "false"):
        return QmvStatus(reason="MLXRT_QMV=0")
    # The kernel's 8-bit activations are the default (MLXRT_QMV_EXACT=1 keeps the exact path:
    # x in 15 bits on AVX2, floats in the portable loops). A build whose rounding met a widened
    # 5-bit layer's weights as q - 128 (mlxrt-qmv 0.5.0, API 5: it took Gemma 3 270M Q4_K_M off
    # llama-server's text, docs/performance.md "8-bit activations") is refused by its API version.
    # Set before the import: the kernel reads it once.
    os.environ.setdefault("MLXRT_QMV_EXACT", "0")
    try:
        import mlxrt_qmv
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "mlxrt_qmv"
        return QmvStatus(reason="mlxrt-qmv not installed" if missing else f"mlxrt-qmv unusable: {exc}")
    import mlx.core as mx

    if mx.default_device() != mx.cpu:
        return QmvStatus(reason="MLX runs on a GPU")
    st = accept(mlxrt_qmv)
    if not st.active:
        log.warning("%s: the quantized layers run MLX's own kernels", st.reason)
    return st


def accept(module: Any) -> QmvStatus:
    """The status of the imported kernel ``module``: usable when its ``API`` is :data:`API`,
    refused otherwise (a build of another checkout; the reason names both versions and the fix)."""
    found = getattr(module, "API", None)  # builds before mlxrt-qmv's API constant have none
    if found != API:
        return QmvStatus(reason=f"mlxrt-qmv has API version {found if found is not None else '< 5'}, mlxrt requires "
                                f"{API}: rebuild it with ./scripts/setup")
    from importlib.metadata import PackageNotFoundError, version

    try:
        dist = version("mlxrt-qmv")
    except PackageNotFoundError:
        dist = "?"
    return QmvStatus(module=module, kernel=module.kernel_name(), threads=module.threads(), version=dist)


def eligible(layer: Any, bits: Any = (4, 8)) -> bool:
    """Whether the kernel computes this layer's product: an affine quantized linear (or quantized
    embedding, for ``as_linear``) of one of ``bits`` (the kernel's ``BITS``: 4 and 8, and with the
    AVX-512 and portable 8-bit kernels 3, 5 and 6) with biases and group size 32, 64 or 128."""
    return (getattr(layer, "mode", "affine") == "affine" and getattr(layer, "bits", None) in bits
            and getattr(layer, "group_size", None) in (32, 64, 128) and "biases" in layer
            and "scales" in layer and layer["weight"].ndim == 2)


@attrs.frozen
class ScalesPlan:
    """What :func:`install` found for one kernel layer's float32 scales and biases: the 16-bit
    type that holds every value exactly (``"float16"``, ``"bfloat16"``; ``None``: neither, they
    stay float32) and the symmetric centre of its biases (:func:`symmetric_centre`; 0: none).
    Found once by comparing every value; the loader keeps them across starts
    (:mod:`mlxrt.loading.kernel_plans`) so that a start with the same weights compares nothing."""

    narrow: str | None
    centre: float = 0.0


def install(model: Any, st: QmvStatus | None = None, *, known: Mapping[str, ScalesPlan] | None = None,
            found: dict[str, ScalesPlan] | None = None, evaluate: bool = True) -> int:
    """Make ``model``'s eligible ``nn.QuantizedLinear`` and ``nn.QuantizedEmbedding`` layers
    (whose ``as_linear`` is a tied output head) compute through the kernel; return how many.
    Each is replaced by an instance of a subclass of its MLX class holding the same parameters
    (:func:`_replace_layers`), so everything that checks ``isinstance`` or reads their parameters
    sees no difference.

    ``known``: each layer's :class:`ScalesPlan` by its path in ``model``, from an earlier start with
    the same weights (a layer it lacks is checked as usual); ``found`` receives every layer's
    (``MLXRT_QMV_COMPACT=0`` keeps every scale float32 and fills nothing). ``evaluate=False`` leaves
    the new layers' arrays to the caller's evaluation: on weights not yet read (mlx-lm's lazy
    load), their layouts are then made as they are read, in place."""
    st = st if st is not None else load()
    if not st.active:
        return 0
    import mlx.core as mx
    import mlx.nn as nn

    classes, bits = _classes(st.module), st.module.BITS
    compacting = os.environ.get("MLXRT_QMV_COMPACT", "1") != "0"  # off: the A/B measurement's other side
    banding = os.environ.get("MLXRT_QMV_BANDS", "1") != "0"  # likewise
    paths = {id(layer): path for path, layer in model.named_modules()}

    def kernel_layer(layer: Any) -> Any:
        if type(layer) not in classes or not eligible(layer, bits):
            return None
        new = classes[type(layer)].of(layer)
        # The primitive reads rows in place: make sure they are (a no-op copy otherwise).
        for key in ("weight", "scales", "biases"):
            new[key] = mx.contiguous(new[key])
        if not compacting:
            return banded(new)
        path = paths.get(id(layer), "")
        plan = (known or {}).get(path)
        narrow = None
        if plan is None or new["scales"].dtype != mx.float32 or new["biases"].dtype != mx.float32:
            narrow = compact_scales(new["scales"], new["biases"])
            plan = ScalesPlan(narrow=None) if narrow is None else ScalesPlan(
                narrow=str(narrow["scales"].dtype).removeprefix("mlx.core."),
                centre=symmetric_centre(new["scales"], new["biases"]))  # on the float32 values
        if found is not None:
            found[path] = plan
        if plan.narrow is not None:
            if narrow is None:  # the plan of an earlier start: cast as compact_scales does
                dtype = getattr(mx, plan.narrow)
                narrow = {key: mx.contiguous(new[key].astype(dtype)) for key in ("scales", "biases")}
            new.bias_centre = plan.centre
            new.update(narrow)
            new.float_scales = True  # its scales stand for float32 ones: what it makes is float32
        return banded(new)

    def banded(new: Any) -> Any:
        # an embedding's lookup reads bands of 8-bit rows only (_band_take): narrower ones stay rows
        if (banding and new.bits in st.module.BAND_BITS and new["weight"].shape[0] % st.module.BAND_ROWS == 0
                and (new.bits == 8 or not isinstance(new, nn.QuantizedEmbedding))):
            # the old layer lets go of its arrays once replaced, so band_rows rewrites them in place
            new.update({"weight": st.module.band_rows(new["weight"], new.bits),
                        "scales": st.module.band_rows(new["scales"]), "biases": st.module.band_rows(new["biases"])})
            new.band = st.module.BAND_ROWS
        return new

    count = _replace_layers(model, kernel_layer)
    if count and evaluate:
        mx.eval(model.parameters())
    return count


def compact_scales(scales: Any, biases: Any) -> dict[str, Any] | None:
    """A kernel layer's float32 ``scales`` and ``biases`` in 16 bits where every value is exact
    there (float16 first, else bfloat16): ``{"scales": …, "biases": …}``; ``None`` where neither
    holds every value (or they are not float32).

    A decode step reads every weight once, and float32 scales and biases of group 32 are a third
    of a 4-bit layer's bytes (SmolLM2 Q4_1: 32 of 110 MiB); a GGUF's Q4_0/Q4_1/Q5_x/Q8_0 blocks
    store theirs as float16, so they round-trip exactly. The kernel reads 16-bit scales beside
    float32 activations (mlxrt-qmv API 7) and widens each row's to float32 itself, so every
    product is the same bits; only the bytes read change."""
    import mlx.core as mx

    if scales.dtype != mx.float32 or biases.dtype != mx.float32:
        return None
    for narrow in (mx.float16, mx.bfloat16):
        s, b = scales.astype(narrow), biases.astype(narrow)
        exact = mx.logical_and(mx.array_equal(s.astype(mx.float32), scales),
                               mx.array_equal(b.astype(mx.float32), biases))
        if exact.item():
            return {"scales": mx.contiguous(s), "biases": mx.contiguous(b)}
    return None


#: The zero points of the symmetric formats a GGUF conversion writes (``2^(bits-1)``).
_CENTRES = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


def symmetric_centre(scales: Any, biases: Any) -> float:
    """``c`` where ``biases == -c * scales`` exactly for a power of two ``c`` (a symmetric block
    format: a GGUF's Q8_0 is ``-128·d``, Q4_0 ``-8·d``, Q5_0 widened to 8 bits ``-16·d``), else 0.
    The kernel's lone-row loops then compute the biases instead of reading them (mlxrt-qmv API 7's
    ``centre``): the same values, an eighth fewer bytes a weight for an 8-bit layer. The candidate
    is read off the largest scale, then checked against every value once."""
    import mlx.core as mx

    flat_scales, flat_biases = scales.reshape(-1), biases.reshape(-1)
    at = mx.argmax(mx.abs(flat_scales))
    scale = flat_scales[at].item()
    centre = -flat_biases[at].item() / scale if scale else 0.0
    if centre in _CENTRES and mx.array_equal(biases, scales * -centre).item():
        return centre
    return 0.0


def _band_take(a: Any, bands: Any, at: Any, band: int) -> Any:
    """Rows ``band * bands + at`` of ``a``, laid out in bands of ``band`` rows
    (``mlxrt_qmv.band_rows``: element ``[t][j][i]`` is row ``band * t + i``'s column ``j``)."""
    return a.reshape(a.shape[0] // band, a.shape[1], band)[bands, :, at]


def _replace_layers(model: Any, replace: Any) -> int:
    """Put ``replace(layer)`` in place of each of ``model``'s leaf layers it returns one for
    (``None``: keep the layer), through MLX's public seam for swapping layers,
    ``Module.update_modules`` (``nn.quantize`` swaps in its quantized layers the same way);
    return how many. A layer object found at several paths is replaced by one new object."""
    import mlx.nn as nn
    from mlx.utils import tree_map

    made: dict[int, Any] = {}

    def visit(layer: Any) -> Any:
        if id(layer) not in made:
            made[id(layer)] = replace(layer)
        return made[id(layer)] if made[id(layer)] is not None else layer

    leaves = tree_map(visit, model.leaf_modules(), is_leaf=nn.Module.is_module)
    count = sum(new is not None for new in made.values())
    if count:
        model.update_modules(leaves)
    return count


_Layer = TypeVar("_Layer")


def _trainable_as(new: _Layer, layer: Any) -> _Layer:
    """``new`` with ``layer``'s parameters, frozen where ``layer``'s are (MLX's layers built by
    their constructors are frozen where they freeze themselves)."""
    from mlx.utils import tree_flatten

    module: Any = new
    module.update(layer.parameters())
    trainable = [key for key, _ in tree_flatten(layer.trainable_parameters())]
    module.freeze(recurse=False)
    if trainable:
        module.unfreeze(recurse=False, keys=trainable)
    return new


def install_fused(model: Any, st: QmvStatus | None = None) -> int:
    """Make ``model``'s ``nn.RMSNorm`` and ``nn.RoPE`` layers, and the attention and gated-MLP
    activation of the mlx-lm model modules it is built from (:func:`mlxrt.compat.route_attention`,
    :func:`mlxrt.compat.route_swiglu`), run the kernel's fused primitives, and its known mlx-lm
    attention layers skip a decode step's layout ops (:mod:`mlxrt.engine.one_token`: with the
    fused primitives those are a quarter of the step's), a lone decode step's attention over a plain or
    rotating cache being the kernel's ``decode_attention`` (3 primitives a layer for 11; ``MLXRT_FUSED_DECODE=0``: not),
    and Gemma's known MLPs compute their activation as the kernel's ``geglu`` (:func:`geglu_routed`);
    return how many layers were swapped (0 without the kernel)."""
    st = st if st is not None else load()
    if not st.active:
        return 0
    def fused(layer: Any) -> Any:
        cls = _fused_class(st.module, type(layer))
        return cls.of(layer) if cls is not None else None

    count = _replace_layers(model, fused)
    if count:
        import mlx.nn as nn

        import mlxrt.engine.one_token as one_token
        from mlxrt import compat

        compat.route_attention(model, _attention(st.module))
        compat.route_swiglu(model, _swiglu(st.module))
        # MLXRT_FUSED_DECODE=0: the lone decode step's eleven primitives a layer, as before (A/B runs)
        off = os.environ.get("MLXRT_FUSED_DECODE", "") in ("0", "off", "false")
        fused_decode = None if off else one_token.FusedDecode(st.module.decode_attention, _fused_classes(st.module)[nn.RoPE])
        count += one_token.install(model, fused_decode)
        if geglu_routed():
            count += _install_geglu(model, st.module)
    return count


def geglu_routed() -> bool:
    """Whether :func:`install_fused` gives Gemma 2 and 3's MLPs the kernel's ``geglu`` (their
    ``gelu_approx(gate) * up`` as one vectorized primitive, within the bound docs/performance.md
    states, not MLX's bits): not on the exact path, ``MLXRT_QMV_EXACT=1`` (read as the kernel reads
    it), whose results stay MLX's, and not with ``MLXRT_QMV_GELU=0`` (A/B runs)."""
    exact = os.environ.get("MLXRT_QMV_EXACT", "") in ("1", "on", "true", "yes")
    return not exact and os.environ.get("MLXRT_QMV_GELU", "") not in ("0", "off", "false")


def _install_geglu(model: Any, module: Any) -> int:
    """Swap ``model``'s mlx-lm ``MLP`` layers whose forward :func:`mlxrt.compat.mlx_lm_forward_known`
    knows (Gemma 2 and 3's) for their :func:`_geglu_class` subclass, through MLX's public
    ``Module.update_modules``; return how many."""
    from mlxrt import compat

    return compat.swap_known_layers(model, "MLP", functools.partial(_geglu_class, module.geglu))


@functools.cache
def _geglu_class(geglu: Any, base: type) -> type:
    """The subclass of mlx-lm's Gemma ``MLP`` ``base`` whose activation is the kernel's ``geglu``
    for float32 projections (other dtypes: mlx-lm's forward)."""
    import mlx.core as mx

    def __call__(self: Any, x: mx.array) -> mx.array:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if gate.dtype != mx.float32 or up.dtype != mx.float32:
            return base.__call__(self, x)
        return self.down_proj(geglu(gate, up))

    return type("GegluMLP", (base,), {"__call__": __call__, "__module__": __name__,
                                      "__doc__": f"{base.__module__}.MLP with the kernel's geglu."})


def draw(sampler: Any, logprobs: Any) -> Any:
    """``sampler(logprobs)``, the tokens a step draws; mlx-lm's greedy sampler (``None`` too) as the
    kernel's one-op ``argmax`` when it is loaded (MLX's result: the first NaN, else the first
    maximum; MLX's CPU argmax compares one element at a time, 0.27 ms a row of a 262K vocabulary,
    2 ms a batch of 8, against 0.13 and 0.22)."""
    from mlx_lm.sample_utils import greedy_sampler

    if sampler is not None and sampler is not greedy_sampler:
        return sampler(logprobs)
    st = load()
    if st.active:
        return st.module.argmax(logprobs)
    return greedy_sampler(logprobs)


def log_softmax(logits: Any) -> Any:
    """``logits - mx.logsumexp(logits, axis=-1, keepdims=True)``, the log-probabilities each decode
    step draws from: the kernel's one-op primitive when it is loaded (MLX's float32 bits; MLX's
    own CPU logsumexp takes its exponentials one at a time, ~0.8 ms a row of a 49K vocabulary
    against ~0.1), MLX's ops otherwise."""
    import mlx.core as mx

    st = load()
    if st.active:
        return st.module.log_softmax(logits)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def top_p_filter() -> Any:
    """mlx-lm's ``apply_top_p(logprobs, top_p)`` (the nucleus filter: tokens outside the smallest
    set holding ``top_p`` of the probability set to -inf) with its sort and exponentials through
    the kernel's primitives, which give MLX's results bit for bit, so the same tokens are drawn:
    ~1 ms a token for a 49K vocabulary against mlx-lm's ~7 (MLX's CPU sort alone 4.6 ms). None
    where the kernel is not loaded."""
    st = load()
    if not st.active:
        return None
    import mlx.core as mx

    sort, exp = st.module.sort, st.module.exp

    def apply_top_p(logprobs: Any, top_p: float) -> Any:
        # mlx-lm's operations in its order, the sort and exp the kernel's
        sorted_logprobs = sort(logprobs)
        sorted_probs = exp(sorted_logprobs.astype(mx.float32))
        mass_above = mx.cumsum(sorted_probs, axis=-1, reverse=True, inclusive=False)
        total_mass = mass_above[..., :1] + sorted_probs[..., :1]
        num_dropped = (mass_above >= top_p * total_mass).sum(axis=-1, keepdims=True)
        threshold = mx.take_along_axis(sorted_logprobs, num_dropped, axis=-1)
        return mx.where(logprobs < threshold, -float("inf"), logprobs)

    return apply_top_p


#: The kernels known faster than float32 through a fast BLAS at every row count, so that
#: ``--dtype auto`` keeps the stored weights without timing them at load (~0.2-0.4 s of every
#: start): x in 8 bits read against 4- or 8-bit weights, measured on SmolLM2's matrices at 1, 8,
#: 64 and 512 rows against float32 through MKL (docs/performance.md, "8-bit activations").
FASTER_THAN_FLOAT32 = frozenset({"avx512 vnni", "avx2 int8"})


def known_faster(module: Any) -> str:
    """Why the kernel ``module`` (``mlxrt_qmv``) computes a quantized model's products faster than
    float32 through the BLAS without measuring it (``""``: not known, measure it)."""
    name = module.kernel_name()
    if name in FASTER_THAN_FLOAT32:
        return (f"the mlxrt-qmv kernel ({name}: 8-bit activations, the faster path at any row count; "
                f"not timed at load)")
    return ""


#: Rows of ``x`` up to which a product runs the kernel (in pieces of ``MAX_ROWS``), not the BLAS
#: on dequantized weights: that dequantizes the whole matrix each call, and loses up to ~40 rows
#: (docs/performance.md, "Prefill: the kernel or the BLAS").
KERNEL_ROWS = 40

_CLASSES: dict[type, type] = {}
_FUSED: dict[type, type] = {}


def _fused_classes(module: Any) -> dict[type, type]:
    """The fused-primitive subclass of ``nn.RMSNorm`` and ``nn.RoPE`` (built once)."""
    if _FUSED:
        return _FUSED
    import mlx.core as mx
    import mlx.nn as nn

    rms_norm, rope = module.rms_norm, module.rope

    class FusedRMSNorm(nn.RMSNorm):
        """``nn.RMSNorm`` as one primitive."""

        @classmethod
        def of(cls, layer: nn.RMSNorm) -> FusedRMSNorm:
            return _trainable_as(cls(layer["weight"].shape[-1], layer.eps), layer)

        def __call__(self, x: mx.array) -> mx.array:
            return rms_norm(x, self["weight"], self.eps)

    class FusedRoPE(nn.RoPE):
        """``nn.RoPE`` as one primitive."""

        @classmethod
        def of(cls, layer: nn.RoPE) -> FusedRoPE:
            return cls(layer.dims, layer.traditional, layer.base, layer.scale)

        def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
            return rope(x, self.dims, self.traditional, self.base, self.scale, offset)

    _FUSED.update({nn.RMSNorm: FusedRMSNorm, nn.RoPE: FusedRoPE})
    return _FUSED


def _fused_class(module: Any, kind: type) -> type | None:
    """The fused-primitive subclass for layers of class ``kind`` (None: none), Gemma's norms
    among them where :func:`mlxrt.compat.mlx_lm_forward_known` knows their forward."""
    classes = _fused_classes(module)
    if kind not in classes and kind.__name__ == "RMSNorm":
        from mlxrt import compat

        if compat.mlx_lm_forward_known(kind):
            classes[kind] = _offset_norm_class(module, kind)
    return classes.get(kind)


def _offset_norm_class(module: Any, base: type) -> type:
    """The subclass of mlx-lm's Gemma ``RMSNorm`` ``base`` (its weight stored less one:
    ``mx.fast.rms_norm(x, 1.0 + weight, eps)``) that computes through the kernel's norm. MLX's CPU
    backend runs ``mx.fast.rms_norm`` as its fallback graph, ~11 primitives a norm: ~1,200 of a
    Gemma 3 270M decode step's ~2,000 (docs/performance.md, "Between the kernel calls")."""
    import mlx.core as mx

    rms_norm = module.rms_norm

    def of(cls: type, layer: Any) -> Any:
        return _trainable_as(cls(layer["weight"].shape[-1], layer.eps), layer)

    def __call__(self: Any, x: mx.array) -> mx.array:
        weight = self["weight"]
        # 1 + weight once per weight array, not a Broadcast and an Add in every step's graph (218
        # of a Gemma 3 270M step's primitives); the same float add, so the same bits. Kept beside
        # the parameters, not among them; recomputed when the weight array is replaced.
        held = self.__dict__.get("_mlxrt_offset_weight")
        if held is None or held[0] is not weight:
            held = (weight, 1.0 + weight)
            object.__setattr__(self, "_mlxrt_offset_weight", held)
        return rms_norm(x, held[1], self.eps)

    return type("FusedOffsetRMSNorm", (base,), {"of": classmethod(of), "__call__": __call__, "__module__": __name__,
                                                "__doc__": f"{base.__module__}.RMSNorm as the kernel's norm and an add."})


def _attention(module: Any) -> Any:
    """mlx-lm's ``scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)``
    through the kernel's primitive (plain caches, no sinks: what a quantized cache or sinks need
    stays mlx-lm's)."""
    attention = module.attention

    def route(original: Any) -> Any:
        def scaled_dot_product_attention(queries: Any, keys: Any, values: Any, cache: Any, scale: float,
                                         mask: Any, sinks: Any = None) -> Any:
            rows = getattr(cache, "mlxrt_rows", None)
            if rows is not None and sinks is None:
                return _by_row(attention, queries, keys, values, scale, rows)
            if sinks is None and not hasattr(cache, "bits"):
                return attention(queries, keys, values, scale, mask)
            return original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

        return scaled_dot_product_attention

    return route


def _by_row(attention: Any, queries: Any, keys: Any, values: Any, scale: float, rows: Any) -> Any:
    """Attention of a batch of prefill chunks (the batch lane's newcomers prefilled together) row
    by row: row ``i``'s first ``n`` queries against its own keys and values, columns
    ``[start, end)`` of the merged cache, with the mask its own cache gives, as its own prefill
    computes it (the same shapes, so the same bits); its padding queries get zeros."""
    import mlx.core as mx

    width = queries.shape[2]
    outs = []
    for i, (start, end, n, mask) in enumerate(rows):
        out = attention(queries[i:i + 1, :, :n], keys[i:i + 1, :, start:end], values[i:i + 1, :, start:end], scale,
                        mask)
        if n < width:
            out = mx.concatenate([out, mx.zeros((1, out.shape[1], width - n, out.shape[3]), out.dtype)], axis=2)
        outs.append(out)
    return mx.concatenate(outs, axis=0)


def rows_invariant(model: Any) -> bool:
    """Whether every row of a forward of ``model`` is computed the same way whatever rows run
    beside it, so that newcomers can be prefilled in one call with each row's bits its own: the
    kernel is loaded with its 8-bit products (any number of rows, each row's integer sums and
    float epilogue its own), every linear layer of the model computes through it (no float or
    MLX-quantized product: those go through the BLAS or MLX's kernels, whose rounding may depend
    on the row count), no float embedding (a tied head would be a float product), and the fused
    primitives are installed (norms, rotations and the attention route, which takes a group's
    rows one by one)."""
    st = load()
    if not st.active or st.module.MAX_ROWS < 4096 or not _CLASSES or not _FUSED:
        return False
    import mlx.nn as nn

    # a wrapper (the batch lane's per-row adapter model: LoRA products are float ones) is not known
    if not isinstance(model, nn.Module):
        return False

    kernel_classes, fused_classes = set(_CLASSES.values()), set(_FUSED.values())
    products = fused = 0
    for _name, layer in model.named_modules():
        kind = type(layer)
        if kind in kernel_classes:
            products += 1
        elif isinstance(layer, (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding)):
            return False
        elif any(part in kind.__name__.lower() for part in ("switch", "conv", "lora", "dora")):
            return False  # experts, convolutions, adapters: products that are not the kernel's
        fused += kind in fused_classes
    return products > 0 and fused > 0


def _swiglu(module: Any) -> Any:
    """mlx-lm's ``swiglu(gate, x)`` through the kernel's primitive for float32 (the same bits);
    other dtypes keep mlx-lm's compiled function."""
    swiglu = module.swiglu

    def route(original: Any) -> Any:
        import mlx.core as mx

        def routed(gate: Any, x: Any) -> Any:
            if gate.dtype == mx.float32 and x.dtype == mx.float32:
                return swiglu(gate, x)
            return original(gate, x)

        return routed

    return route


def _classes(module: Any) -> dict[type, type]:
    """The kernel-backed subclass of each quantized layer class (built once)."""
    if _CLASSES:
        return _CLASSES
    import mlx.core as mx
    import mlx.nn as nn

    qmm, dequantize, max_rows = module.quantized_matmul, module.dequantize, module.MAX_ROWS
    chunked_rows = max(KERNEL_ROWS, max_rows)

    def product(layer: Any, x: mx.array) -> mx.array:
        w, scales, biases, gs, bits = layer["weight"], layer["scales"], layer["biases"], layer.group_size, layer.bits
        centre, band = getattr(layer, "bias_centre", 0.0), getattr(layer, "band", 0)
        width = x.shape[-1]
        rows = x.size // width if width else 0
        if rows <= max_rows:
            return qmm(x, w, scales, biases, gs, bits, centre, band)
        if rows <= chunked_rows or band:  # the kernel in pieces of max_rows: rows are independent
            flat = x.reshape(rows, width)
            pieces = [qmm(flat[i:i + max_rows], w, scales, biases, gs, bits, centre, band)
                      for i in range(0, rows, max_rows)]
            return mx.concatenate(pieces).reshape(*x.shape[:-1], -1)
        if scales.dtype != x.dtype:  # compact scales (compact_scales): the weights at x's width
            scales, biases = scales.astype(x.dtype), biases.astype(x.dtype)
        return x @ dequantize(w, scales, biases, gs, bits).T

    class KernelQuantizedLinear(nn.QuantizedLinear):
        """``nn.QuantizedLinear`` whose product runs the mlxrt-qmv kernel."""

        @classmethod
        def of(cls, layer: nn.QuantizedLinear) -> KernelQuantizedLinear:
            # MLX is lazy: the constructor's random weights are never computed, update() replaces them
            out_dims, packed = layer["weight"].shape
            new = cls(packed * 32 // layer.bits, out_dims, "bias" in layer, layer.group_size, layer.bits, layer.mode)
            return _trainable_as(new, layer)

        def __call__(self, x: mx.array) -> mx.array:
            y = product(self, x)
            if "bias" in self:
                y = y + self["bias"]
            return y

    class KernelQuantizedEmbedding(nn.QuantizedEmbedding):
        """``nn.QuantizedEmbedding`` whose ``as_linear`` (a tied output head) runs the kernel."""

        @classmethod
        def of(cls, layer: nn.QuantizedEmbedding) -> KernelQuantizedEmbedding:
            new = cls(layer.num_embeddings, layer.dims, layer.group_size, layer.bits, layer.mode)
            return _trainable_as(new, layer)

        def as_linear(self, x: mx.array) -> mx.array:
            return product(self, x)

        def __call__(self, x: mx.array) -> mx.array:
            if self.bits not in (4, 8):  # 3, 5, 6 bits cross the words: MLX's own unpacking
                if getattr(self, "float_scales", False):  # compact scales, widened exactly
                    return mx.dequantize(self["weight"][x], self["scales"][x].astype(mx.float32),
                                         self["biases"][x].astype(mx.float32), self.group_size, self.bits)
                return super().__call__(x)
            return lookup(self, x)

    # The nibbles of a word, lowest first (MLX's packing), for the 4-bit lookup.
    nibble_shifts = mx.arange(0, 32, 4, dtype=mx.uint32)
    mx.eval(nibble_shifts)

    def lookup(layer: Any, ids: mx.array) -> mx.array:
        """``mx.dequantize`` of the rows ``ids`` picks, in ~17 primitives (8 bits) or ~23 (4 bits)
        where MLX's CPU graph for it is 36 or 56 (a decode step's embedding): the same unpacking
        and the same float multiply, then add, so the same bits."""
        flat = ids.reshape(-1)
        band = getattr(layer, "band", 0)
        if band:  # row r is column r % band of band r // band (mlxrt_qmv.band_rows)
            bands, at = flat // band, flat % band
            packed, scales, biases = (_band_take(layer[key], bands, at, band) for key in ("weight", "scales", "biases"))
        else:
            packed, scales, biases = (mx.take(layer[key], flat, axis=0) for key in ("weight", "scales", "biases"))
        if layer.bits == 8:
            q = packed.view(mx.uint8)  # little-endian: byte j of a word is its element j
        else:
            q = (packed[..., None] >> nibble_shifts) & 15
        if getattr(layer, "float_scales", False):  # compact scales, widened exactly
            scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
        q = q.reshape(flat.shape[0], scales.shape[-1], layer.group_size).astype(scales.dtype)
        return (q * scales[..., None] + biases[..., None]).reshape(*ids.shape, -1)

    _CLASSES.update({nn.QuantizedLinear: KernelQuantizedLinear, nn.QuantizedEmbedding: KernelQuantizedEmbedding})
    return _CLASSES
