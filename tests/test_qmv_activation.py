"""The mlxrt-qmv kernel's ``swiglu`` primitive: mlx-lm's ``silu(gate) * x`` with the same float32
bits as MLX's CPU ops (edge values, a tail shorter than eight, a buffer split over threads, views),
MLX's own ops for what it does not take, and, routed by ``install_fused``, one op in a llama
model's MLP with a model's logits unchanged to the bit. Its ``log_softmax`` primitive: a decode
step's log-probabilities, ``logits - mx.logsumexp(logits, axis=-1, keepdims=True)``, with MLX's
bits, as the engine computes them. Skipped where the kernel is not built."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from support import primitive_counts

from mlxrt.engine import qmv

try:
    import mlxrt_qmv as ext
except ImportError:
    ext = None
pytestmark = pytest.mark.skipif(ext is None, reason="mlxrt-qmv is not built (scripts/setup builds it with a compiler)")


def _reference(gate: mx.array, x: mx.array) -> mx.array:
    from mlx_lm.models import activations

    return getattr(activations.swiglu, "__wrapped__", activations.swiglu)(gate, x)


def _same_bits(got: mx.array, ref: mx.array) -> bool:
    a, b = np.array(got.astype(mx.float32)), np.array(ref.astype(mx.float32))
    return got.dtype == ref.dtype and bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def test_swiglu_gives_mlx_s_bits():
    rng = np.random.default_rng(0)
    ties = (np.arange(-130, 130) + 0.5) / np.float32(1.442695)  # x·log2(e) near the halves MLX rounds up
    ties = ties.astype(np.float32)
    gate = np.concatenate([np.asarray(part, np.float32) for part in (
        *(rng.standard_normal(100_000) * s for s in (0.01, 1.0, 8.0, 60.0)),
        np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)), ties,
        [0.0, -0.0, np.inf, -np.inf, np.nan, 88.0, -88.0, 88.00001, -88.00001, 1e-40, -1e-40, 3.4e38, -3.4e38],
    )] + [rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])  # any bits
    gate = mx.array(gate[: len(gate) // 8 * 8 + 5])  # a tail of five after the eights
    x = mx.array(rng.standard_normal(gate.size).astype(np.float32))
    assert _same_bits(ext.swiglu(gate, x), _reference(gate, x))
    for shape in [(1, 1, 1536), (1, 31, 1536), (3, 7, 5)]:
        g, y = mx.random.normal(shape), mx.random.normal(shape)
        assert _same_bits(ext.swiglu(g, y), _reference(g, y)), shape
    g, y = mx.random.normal((64, 48)).T, mx.random.normal((48, 64))  # a transposed view
    assert _same_bits(ext.swiglu(g, y), _reference(g, y))


def test_swiglu_leaves_other_dtypes_and_shapes_to_mlx():
    g, y = mx.random.normal((4, 64)), mx.random.normal((4, 64))
    for dtype in (mx.bfloat16, mx.float16):
        assert _same_bits(ext.swiglu(g.astype(dtype), y.astype(dtype)), _reference(g.astype(dtype), y.astype(dtype)))
    assert _same_bits(ext.swiglu(g, y[:1]), _reference(g, y[:1]))  # broadcasting


def test_swiglu_is_one_primitive_and_reads_strided_inputs_itself():
    # no Contiguous beside it: a gated MLP would set up and dispatch two more primitives a layer
    g, y = mx.random.normal((4, 64)), mx.random.normal((4, 64))
    mx.eval(g, y)
    assert primitive_counts(ext.swiglu(g, y)) == Counter({"MlxrtSwiglu": 1})
    wide, row = mx.random.normal((4, 65)), mx.random.normal((1, 64))
    tall = mx.random.normal((8, 64))
    for gv, yv in [(wide[:, 1:], y), (mx.broadcast_to(row, (4, 64)), g), (tall[::2], tall[1::2]), (g, wide[:, :64])]:
        assert _same_bits(ext.swiglu(gv, yv), _reference(gv, yv))


def test_install_fused_routes_a_llama_mlp_s_swiglu_and_leaves_its_logits_as_they_were():
    from mlx_lm.models import activations, llama

    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=224,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256)
    mx.random.seed(7)
    model = llama.Model(args)
    nn.quantize(model, group_size=32, bits=4)
    tokens = mx.array([list(range(3, 40))])
    saved = llama.swiglu
    try:
        llama.swiglu = activations.swiglu
        assert qmv.install_fused(model) > 0
        assert llama.swiglu.__wrapped__ is activations.swiglu
        routed = model(tokens)
        assert primitive_counts(routed)["MlxrtSwiglu"] == 2  # one per layer
        llama.swiglu = activations.swiglu  # the norms and rotary layers stay fused: only swiglu differs
        mlx_s = model(tokens)
        assert "MlxrtSwiglu" not in primitive_counts(mlx_s)
        assert mx.array_equal(routed, mlx_s).item()
    finally:
        llama.swiglu = saved



def _log_softmax_mlx(x: mx.array) -> mx.array:
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def test_log_softmax_gives_mlx_s_bits():
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal(n).astype(np.float32) * s for n, s in
            ((49152, 1.0), (49152, 25.0), (151936, 4.0), (37, 1e-3), (8, 80.0), (1, 3.0), (13, 1e4))]
    edge = rng.standard_normal(1000).astype(np.float32)
    for values in ([np.inf], [-np.inf], [np.nan], [np.nan, np.inf], [1e-40, -1e-40, 0.0, -0.0], [3.4e38, -3.4e38]):
        row = edge.copy()
        row[rng.choice(row.size, len(values), replace=False)] = values
        rows.append(row)
    rows.append(np.full(19, -np.inf, np.float32))  # every token masked out
    rows.append(rng.integers(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32))  # any bits
    for row in rows:
        x = mx.array(row)[None]
        assert _same_bits(ext.log_softmax(x), _log_softmax_mlx(x)), row.size
    batch = mx.random.normal((8, 49152)) * 6  # a batch's rows, split over the kernel's threads
    assert _same_bits(ext.log_softmax(batch), _log_softmax_mlx(batch))
    for x in (mx.random.normal((2, 3, 1000)), mx.random.normal((300, 5)).T):  # more axes, a transposed view
        assert _same_bits(ext.log_softmax(x), _log_softmax_mlx(x))


def test_log_softmax_leaves_other_dtypes_to_mlx():
    x = mx.random.normal((3, 500))
    for dtype in (mx.bfloat16, mx.float16):
        assert _same_bits(ext.log_softmax(x.astype(dtype)), _log_softmax_mlx(x.astype(dtype)))
    assert "MlxrtLogSoftmax" not in primitive_counts(ext.log_softmax(x.astype(mx.float16)))


def test_the_engine_draws_from_the_primitive_s_log_probabilities():
    logits = mx.random.normal((4, 49152)) * 8
    got = qmv.log_softmax(logits)
    assert "MlxrtLogSoftmax" in primitive_counts(got)
    assert _same_bits(got, _log_softmax_mlx(logits))
