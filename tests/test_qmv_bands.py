"""Weights in bands of 16 rows (mlxrt-qmv API 9): ``band_rows`` lays a matrix out so, the AVX-512
VNNI kernel's products read it with each row's result its own bits whatever rows of ``x`` run
beside it (a batch's step, a prefill's chunk), near the row-major product (only the float
additions' order differs), 3-, 4-, 5- and 6-bit bands with the bits of the same integers in 8-bit
bands; other kernels refuse the layout rather than compute another product; and ``install`` bands
a model's layers (an 8-bit embedding's lookup reading the bands, the same rows) without changing
greedy tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from support import greedy, tiny_quantized_llama

from mlxrt.engine import qmv
from mlxrt.loading.gguf_quant import pack

try:
    import mlxrt_qmv as ext
except ImportError:
    ext = None
pytestmark = pytest.mark.skipif(ext is None, reason="mlxrt-qmv is not built (scripts/setup builds it with a compiler)")
banding = pytest.mark.skipif(ext is None or 8 not in ext.BAND_BITS,
                             reason="this kernel reads no weights in bands (the AVX-512 VNNI one does)")


def _symmetric_8bit(n: int, k: int, gs: int, scale_dtype, seed: int):
    """A Q8_0-like layer: integers about 128, float16-exact scales, biases -128 times them."""
    rng = np.random.default_rng(seed)
    q = np.clip(np.rint(128 + rng.standard_normal((n, k)) * 40), 0, 255).astype(np.uint8)
    d = (rng.random((n, k // gs)) * 0.02 + 0.002).astype(np.float16)
    s = mx.array(d).astype(scale_dtype)
    return mx.array(q.view(np.uint32)), s, s * -128.0


def _x(rows: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)) * rng.uniform(0.1, 8.0, (rows, 1))
    x[:, k // 3] *= 300.0  # an outlier: most of its block rounds to 0
    return mx.array(x.astype(np.float32))


def test_band_rows_interleaves_each_band_s_rows_column_by_column():
    rng = np.random.default_rng(0)
    for a in (rng.integers(0, 2**32, (48, 10), dtype=np.uint32), rng.standard_normal((32, 7)).astype(np.float16)):
        got = np.array(ext.band_rows(mx.array(a)))
        assert got.shape == a.shape and got.dtype == a.dtype
        assert np.array_equal(got, a.reshape(-1, 16, a.shape[1]).transpose(0, 2, 1).reshape(a.shape))
    fresh = mx.arange(16 * 5, dtype=mx.uint32).reshape(16, 5) * 3  # unreferenced once computed: permuted in place
    assert np.array_equal(np.array(ext.band_rows(fresh)), (np.arange(80, dtype=np.uint32).reshape(16, 5) * 3).T.reshape(16, 5))
    with pytest.raises(ValueError, match="multiple of 16"):
        ext.band_rows(mx.zeros((24, 4), dtype=mx.uint32))


@banding
@pytest.mark.parametrize("gs, scale_dtype, centre", [(32, mx.float16, 128.0), (32, mx.float16, 0.0),
                                                     (64, mx.float32, 0.0), (32, mx.bfloat16, 0.0)])
def test_each_row_of_a_banded_product_is_that_row_alone_and_near_the_row_major_one(gs, scale_dtype, centre):
    # a lone row four bands at a time, 2-4 rows two bands at a time, more eight rows a band at a
    # time and the rest: every row count gives each row the same bits
    w, s, b = _symmetric_8bit(96, 640, gs, scale_dtype, seed=gs)
    wb, sb, bb = ext.band_rows(w), ext.band_rows(s), ext.band_rows(b)
    x = _x(19, 640, seed=gs)
    alone = mx.concatenate([ext.quantized_matmul(x[i:i + 1], wb, sb, bb, gs, 8, centre, band=16) for i in range(19)])
    for rows in (2, 3, 4, 5, 8, 13, 19):
        got = ext.quantized_matmul(x[:rows], wb, sb, bb, gs, 8, centre, band=16)
        assert mx.array_equal(got, alone[:rows]).item(), rows
    # the centre computes the biases it promises: the same bits as reading them
    assert mx.array_equal(ext.quantized_matmul(x, wb, sb, bb, gs, 8, band=16), alone).item()
    # the row-major product of the same x rounded alike: only the float additions' order differs
    rowmajor = ext.quantized_matmul(x, w, s, b, gs, 8, centre)
    scale = mx.abs(rowmajor).max(axis=-1, keepdims=True)
    assert (mx.abs(alone - rowmajor) <= 1e-5 * scale).all().item(), mx.abs(alone - rowmajor).max().item()


@pytest.mark.parametrize("bits", [4, 5, 3, 6])
def test_narrower_bands_give_the_bits_of_the_same_integers_in_8_bit_bands(bits):
    # band_rows(w, bits) lays the values out as the kernel's operands: unpacked in registers, the
    # same integers meet x in the same order as the layer widened to 8 bits
    if bits not in ext.BAND_BITS:
        pytest.skip(f"{ext.kernel_name()!r} reads no {bits}-bit weights in bands")
    rng = np.random.default_rng(bits)
    top, centre = (1 << bits) - 1, 1 << (bits - 1)
    for n, k in ((48, 640), (32, 96)):
        q = np.clip(np.rint(centre + rng.standard_normal((n, k)) * top / 6), 0, top).astype(np.uint8)
        d = mx.array((rng.random((n, k // 32)) * 0.02 + 0.002).astype(np.float16))
        sb, bb = ext.band_rows(d), ext.band_rows(d * -float(centre))
        narrow, wide = ext.band_rows(mx.array(pack(q, bits)), bits), ext.band_rows(mx.array(pack(q, 8)), 8)
        x = _x(9, k, seed=k)
        for rows in (1, 2, 5, 9):
            got = ext.quantized_matmul(x[:rows], narrow, sb, bb, 32, bits, float(centre), band=16)
            assert mx.array_equal(got, ext.quantized_matmul(x[:rows], wide, sb, bb, 32, 8, float(centre), band=16)).item()
        # and near the row-major product of the same layer
        rowmajor = ext.quantized_matmul(x, mx.array(pack(q, bits)), d, d * -float(centre), 32, bits, float(centre))
        assert (mx.abs(got - rowmajor) <= 1e-5 * mx.abs(rowmajor).max(axis=-1, keepdims=True)).all().item()


@banding
def test_a_prefill_sized_product_and_leading_dimensions():
    w, s, b = _symmetric_8bit(64, 256, 32, mx.float16, seed=7)
    wb, sb, bb = ext.band_rows(w), ext.band_rows(s), ext.band_rows(b)
    x = _x(70, 256, seed=7).reshape(2, 35, 256)
    got = ext.quantized_matmul(x, wb, sb, bb, 32, 8, 128.0, band=16)
    assert got.shape == (2, 35, 64)
    last = ext.quantized_matmul(x[1, -1:], wb, sb, bb, 32, 8, 128.0, band=16)
    assert mx.array_equal(got[1, -1:], last).item()


@pytest.mark.skipif(ext is None, reason="mlxrt-qmv is not built")
def test_what_the_kernel_cannot_read_in_bands_is_refused_not_computed_otherwise():
    w, s, b = _symmetric_8bit(32, 64, 32, mx.float16, seed=1)
    x = _x(1, 64, seed=1)
    with pytest.raises(ValueError, match="3, 4, 5, 6 or 8 bits"):
        ext.band_rows(w, 7)
    w2, s2, b2 = mx.quantize(mx.ones((32, 64)), group_size=32, bits=2)
    with pytest.raises(ValueError, match="reads no 2-bit weights in bands"):
        ext.quantized_matmul(x, w2, s2, b2, 32, 2, band=16)
    if 8 not in ext.BAND_BITS:  # the AVX2 and portable kernels: no layout of bands at all
        with pytest.raises(ValueError, match="reads no 8-bit weights in bands"):
            ext.quantized_matmul(x, w, s, b, 32, 8, band=16)
        return
    with pytest.raises(ValueError, match="multiple of 16"):
        ext.quantized_matmul(x, w[:24], s[:24], b[:24], 32, 8, band=16)
    with pytest.raises(ValueError, match="reads no 8-bit weights in bands of 8"):
        ext.quantized_matmul(x, w, s, b, 32, 8, band=8)




@pytest.mark.parametrize("bits, embedding_bits", [(8, 8), (4, 8), (5, 4)])
def test_install_bands_the_layers_and_tokens_and_lookups_stay(monkeypatch, bits, embedding_bits):
    # every layer the kernel reads in bands is banded; an embedding only at 8 bits (its lookup
    # reads 8-bit bands: a narrower one stays rows, its tied head the row-major product)
    if not {bits, embedding_bits} <= set(ext.BAND_BITS):
        pytest.skip(f"{ext.kernel_name()!r} reads no {bits}- or {embedding_bits}-bit weights in bands")
    prompt = list(range(5, 45))
    rows_model = tiny_quantized_llama(bits, embedding_bits, seed=5)
    monkeypatch.setenv("MLXRT_QMV_BANDS", "0")
    qmv.install(rows_model)
    monkeypatch.delenv("MLXRT_QMV_BANDS")
    model = tiny_quantized_llama(bits, embedding_bits, seed=5)
    ids = mx.array([[0, 3, 17, 255, 511]])
    looked_up = model.model.embed_tokens(ids)  # MLX's own lookup, before install
    assert qmv.install(model) == 2 * 7 + 1
    for name, layer in model.named_modules():
        if "scales" in layer:
            banded = embedding_bits == 8 or name != "model.embed_tokens"
            assert getattr(layer, "band", 0) == (16 if banded else 0), name
    assert all(getattr(m, "band", 0) == 0 for _, m in rows_model.named_modules() if "scales" in m)
    # the lookup reads the bands: MLX's rows, bit for bit
    assert mx.array_equal(model.model.embed_tokens(ids), looked_up).item()
    assert greedy(model, prompt, 10) == greedy(rows_model, prompt, 10)
    # a batch of two prompts: each row's logits are those of its prompt alone
    both = model(mx.array([prompt[:20], prompt[20:]]))
    for i, piece in enumerate((prompt[:20], prompt[20:])):
        assert mx.array_equal(both[i:i + 1], model(mx.array([piece]))).item()
