"""A quantized matrix-vector product for MLX's CPU backend: the ``MlxrtQuantizedMatvec`` primitive.

``quantized_matmul(x, w, scales, biases, group_size, bits)`` equals
``mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=..., bits=...)`` in affine
mode (the ``mx.quantize`` layout) and runs a kernel that reads the packed weights once, for
bits 4 or 8, group sizes 32/64/128 and at most :data:`MAX_ROWS` rows of ``x`` on the CPU, its
output rows split over threads (``MLXRT_QMV_THREADS``); other arguments go to
``mx.quantized_matmul`` itself. ``kernel_name()`` says which kernel this process runs, chosen
once at load: by default ``x`` rounded to 8 bits per block of 32 and integer multiply-adds —
``avx512 vnni`` where the CPU has AVX-512 F/BW/VL/VNNI, ``avx2 int8`` where it has AVX2,
``portable int8`` elsewhere (``MLXRT_QMV_KERNEL=portable`` forces it, and the portable loops of
the fused and activation primitives below with it) — each row's result its own
bits whatever rows run beside it, so :data:`MAX_ROWS` is 65,536; ``MLXRT_QMV_EXACT=1``: the exact
path, ``avx2 q15`` (x in 15 bits) or ``generic`` (portable floats), 32 rows at most; on request
``avx2+fma`` (float: MLX's products to rounding). docs/performance.md has their error bounds. ``dequantize(w, scales,
biases, group_size, bits)`` equals ``mx.dequantize`` (affine) and runs at memory speed, so that
more rows than :data:`MAX_ROWS` can go through the BLAS (``x @ dequantize(...).T``).

The fused primitives compute what MLX's CPU backend runs as small-op fallback graphs, each as
one op: ``rms_norm(x, weight, eps)`` (``mx.fast.rms_norm``), ``rope(x, dims, traditional, base,
scale, offset)`` (``mx.fast.rope``, default frequencies) and ``attention(q, k, v, scale, mask)``
(``mx.fast.scaled_dot_product_attention`` without sinks; more than :data:`MAX_QUERIES` queries, a
prefill chunk, run MLX's own fallback graph with ``softmax``), for float32 on the CPU; other
arguments go to the ``mx.fast`` operation itself. ``softmax(x)`` is ``mx.softmax(x, axis=-1)``
as one op, MLX's float32 bits (its CPU exponential is one element at a time too). ``swiglu(gate,
x)`` is mlx-lm's ``nn.silu(gate) * x`` as one op, the same float32 bits (MLX's CPU sigmoid runs
one element at a time through a software fma on x86-64). ``geglu(gate, up)`` is
``nn.gelu_approx(gate) * up`` (Gemma's MLP) as one op, vectorized, within a stated bound of MLX's
float32 (not its bits; API 8). ``log_softmax(x)`` is ``x -
mx.logsumexp(x, axis=-1, keepdims=True)`` as one op, MLX's float32 bits: a decode step's
log-probabilities over the vocabulary. ``exp(x)`` and ``sort(x)`` are ``mx.exp`` and ``mx.sort(x,
axis=-1)`` with MLX's float32 results, for a sampler's nucleus (top-p) filter. ``argmax(x)`` (API 9)
is ``mx.argmax(x, axis=-1)`` with MLX's result, a greedy draw from a decode step's log-probabilities.
``decode_attention(q, k, v, k_cache, v_cache, offset, scale, dims, traditional, base, rope_scale,
row=None, length=None)`` is one token's attention step over mlx-lm's ``KVCache`` or
``RotatingKVCache`` buffers in three ops: k (rotated by ``rope`` at ``offset``) and v written into
row ``row`` (default ``offset``) of the caches (the arrays updated in place, as ``k_cache[...,
row, :] = k`` updates one; the buffer reused where MLX would donate it), and ``attention`` of the
rotated q over their first ``length`` rows (default ``offset + 1``; a wrapped rotating cache's
whole buffer), the same bits as those ops.

``band_rows(a)`` (API 9) lays a 2-D array out in bands of :data:`BAND_ROWS` rows (element
``[t][j][i]`` is ``a[16t + i][j]``; the same shape), and ``quantized_matmul(..., band=16)`` reads
weights, scales and biases so laid out, for the widths :data:`BAND_BITS` names: with ``avx512 vnni``
8-bit weights, whose products for several rows of ``x`` then take a third of the float work (a
batch's decode step, a prefill), a lone row's no slower. Each row's result is its own bits whatever
rows run beside it, as ever; not the row-major loops' bits (another order of the same float
additions; docs/performance.md, "8-bit weights in bands of 16 rows").

Importing this package raises ``ImportError`` when the installed MLX is not the one the
extension was built against (:data:`BUILT_FOR_MLX`): the primitive is C++ against MLX's ABI.
"""

from __future__ import annotations

import mlx.core as mx

from mlxrt_qmv import _ext

__all__ = ["quantized_matmul", "dequantize", "supported", "rms_norm", "rope", "attention", "swiglu", "geglu", "softmax", "log_softmax", "exp", "sort",
           "attention_supported", "decode_attention", "decode_attention_supported",
           "kernel_name", "threads", "set_threads", "MAX_ROWS", "MAX_QUERIES", "BITS", "FAST_BITS", "BUILT_FOR_MLX",
           "API", "band_rows", "BAND_ROWS", "BAND_BITS", "argmax"]

#: The interface version mlxrt requires exactly (``mlxrt.engine.qmv.API``): every function and
#: attribute of this module, as documented above. Raised with any change mlxrt relies on.
API: int = _ext.API
#: The MLX version whose headers the extension was compiled with.
BUILT_FOR_MLX: str = _ext.MLX_VERSION
#: The most rows of ``x`` the primitive takes.
MAX_ROWS: int = _ext.MAX_ROWS
#: The weight widths the primitive computes with this process's kernel (4 and 8; with the AVX-512
#: and portable 8-bit kernels also 3, 5 and 6, through the portable loops).
BITS: tuple[int, ...] = tuple(_ext.BITS)
#: Of :data:`BITS`, the widths whose product for a decode step's rows of ``x`` (1 to 7) this
#: process's kernel computes at least as fast as for the same integers in 8-bit words (API 8): 4
#: and 8, and with ``avx512 vnni`` on a CPU with AVX-512 VBMI also 3, 5 and 6 (unpacked in
#: registers; the same bits as the 8-bit words). mlxrt's
#: GGUF conversion serves a lossless 5-bit layer (Q5_0, Q5_1, Q5_K) as stored where 5 is here and
#: widens it to 8 bits elsewhere.
FAST_BITS: tuple[int, ...] = tuple(_ext.FAST_BITS)
#: Rows a band holds (:func:`band_rows`).
BAND_ROWS: int = _ext.BAND_ROWS
#: The weight widths ``quantized_matmul(..., band=16)`` takes with this process's kernel (API 9):
#: ``(8,)`` with ``avx512 vnni``, none with the others.
BAND_BITS: tuple[int, ...] = tuple(_ext.BAND_BITS)
#: The most query positions the attention primitive takes.
MAX_QUERIES: int = _ext.MAX_QUERIES

if mx.__version__.split(".dev")[0] != BUILT_FOR_MLX:
    raise ImportError(f"mlxrt_qmv was built for mlx {BUILT_FOR_MLX}, this is mlx {mx.__version__}: "
                      "rebuild it (pip install --no-build-isolation --force-reinstall ./kernels/mlxrt-qmv)")

quantized_matmul = _ext.quantized_matmul
dequantize = _ext.dequantize
band_rows = _ext.band_rows
supported = _ext.supported
kernel_name = _ext.kernel_name
threads = _ext.threads
set_threads = _ext.set_threads
rms_norm = _ext.rms_norm
rope = _ext.rope
attention = _ext.attention
swiglu = _ext.swiglu
geglu = _ext.geglu
softmax = _ext.softmax
log_softmax = _ext.log_softmax
exp = _ext.exp
argmax = _ext.argmax
sort = _ext.sort
attention_supported = _ext.attention_supported
decode_attention = _ext.decode_attention
decode_attention_supported = _ext.decode_attention_supported
