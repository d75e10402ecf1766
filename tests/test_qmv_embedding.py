"""The kernel's quantized embedding looks its rows up in fewer primitives than MLX's CPU
``dequantize`` graph, with MLX's bits (4 and 8 bits; other widths are MLX's own lookup)."""

from __future__ import annotations

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


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_lookup_gives_mlx_s_bits_in_fewer_primitives(bits, group_size, dtype):
    mx.random.seed(bits + group_size)
    table = nn.Embedding(300, 256)
    table.weight = mx.random.normal((300, 256)) * 3
    ref_layer = nn.QuantizedEmbedding.from_embedding(table, group_size=group_size, bits=bits)
    ref_layer.update({k: ref_layer[k].astype(dtype) for k in ("scales", "biases")})
    mx.eval(ref_layer.parameters())
    layer = qmv._classes(ext)[nn.QuantizedEmbedding].of(ref_layer)
    every = mx.arange(300)
    got, ref = layer(every), ref_layer(every)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    a, b = np.array(got.astype(mx.float32)), np.array(ref.astype(mx.float32))
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    step = mx.array([[42]])  # a decode step's token
    mx.eval(step)
    assert layer(step).shape == ref_layer(step).shape == (1, 1, 256)
    assert primitive_counts(layer(step)).total() < primitive_counts(ref_layer(step)).total() * 2 // 3
    prompt = mx.array([[1, 2, 3], [4, 5, 299]])
    assert mx.array_equal(layer(prompt), ref_layer(prompt)).item()
