"""The mlxrt-qmv kernel's 3-, 5- and 6-bit weights (a GGUF's Q5_0/Q5_1/Q5_K layers served as
stored, issue 48): a product equals, bit for bit, the product of the same integers widened to 8-bit
words, for one row of x (a decode step: on AVX-512 with VBMI unpacked in registers, elsewhere
unpacked to a buffer first) and for several (unpacked a band at a time), so the conversion may keep
a layer at 5 bits without changing a token. ``.ci/run`` runs this file again with the portable
loops forced; the AVX2 loops compute 4 and 8 bits only (5 is MLX's own op there)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxrt.loading.gguf_quant import pack

try:
    import mlxrt_qmv as qmv_ext
except ImportError:
    qmv_ext = None
pytestmark = pytest.mark.skipif(qmv_ext is None, reason="mlxrt-qmv is not built (scripts/setup builds it)")

#: (N, K): K = 32 (one block: a lone partial chunk), 96 and 608 (an odd number of blocks: a last
#: chunk of one block, 608 also no multiple of 128), 640 (Gemma 3's width, 20 blocks: five steps of
#: four) and 160; N from 1 to 130 (tiles of four weight rows and a remainder).
SHAPES = [(5, 32), (9, 96), (37, 608), (130, 640), (64, 160), (1, 640)]


def _layer(n: int, k: int, bits: int, symmetric: bool, scale_dtype, seed: int):
    """Integers 0..2^bits - 1 about the centre as a trained layer's are, packed at ``bits`` and at 8,
    float16-exact block scales of 32 in ``scale_dtype``, and biases: ``-centre * d`` (Q5_0) or a
    float16 minimum (Q5_1)."""
    rng = np.random.default_rng(seed)
    top, centre = (1 << bits) - 1, 1 << (bits - 1)
    q = np.clip(np.rint(centre + rng.standard_normal((n, k)) * top / 6), 0, top).astype(np.uint8)
    d = (rng.random((n, k // 32)) * 0.02 + 0.002).astype(np.float16)
    m = -centre * d if symmetric else (rng.standard_normal((n, k // 32)) * 0.05).astype(np.float16)
    s, b = mx.array(d).astype(scale_dtype), mx.array(m).astype(scale_dtype)
    return mx.array(pack(q, bits)), mx.array(pack(q, 8)), s, b, float(centre) if symmetric else 0.0


def _x(rows: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)) * rng.uniform(0.1, 8.0, (rows, 1))
    x[:, k // 3] *= 300.0  # an outlier: most of its block rounds to 0
    return mx.array(x.astype(np.float32))


@pytest.mark.parametrize("bits", [5, 3, 6])
@pytest.mark.parametrize("symmetric, scale_dtype", [(True, mx.float16), (False, mx.float16), (False, mx.float32)])
def test_a_packed_layer_s_product_is_its_8_bit_widening_s_bit_for_bit(bits, symmetric, scale_dtype):
    # Q5_0 as installed (float16 scales, the centre 16 computed, not read), Q5_1 (float16 scales
    # and minimums) and Q5_K (float32 scales: d * scale_j is not exact in 16 bits), for one row of
    # x, a batch's few and a prefill's many.
    if bits not in qmv_ext.BITS:
        pytest.skip(f"{bits}-bit weights are MLX's own op with {qmv_ext.kernel_name()!r}")
    for n, k in SHAPES:
        packed, wide, s, b, centre = _layer(n, k, bits, symmetric, scale_dtype, seed=n + k + bits)
        x = _x(9, k, seed=k)
        for rows in (1, 2, 3, 5, 9):  # a lone row's loop, the packed tiles of 2-7 rows, the band loops from 8
            got = qmv_ext.quantized_matmul(x[:rows], packed, s, b, 32, bits, centre)
            want = qmv_ext.quantized_matmul(x[:rows], wide, s, b, 32, 8, centre)
            assert mx.array_equal(got, want).item(), (n, k, rows, mx.abs(got - want).max().item())
        # without the centre promised: the biases read, the same bits
        assert mx.array_equal(qmv_ext.quantized_matmul(x[:1], packed, s, b, 32, bits),
                              qmv_ext.quantized_matmul(x[:1], wide, s, b, 32, 8)).item()


@pytest.mark.parametrize("gs, scale_dtype", [(64, mx.float16), (128, mx.float32), (32, mx.bfloat16)])
def test_other_groups_and_bfloat16_scales_give_the_8_bit_widening_s_bits(gs, scale_dtype):
    # what an mx.quantize'd 5-bit layer may bring: the band loops' scales widened to float32 first
    if 5 not in qmv_ext.BITS:
        pytest.skip(f"5-bit weights are MLX's own op with {qmv_ext.kernel_name()!r}")
    rng = np.random.default_rng(gs)
    q = rng.integers(0, 32, (43, 384)).astype(np.uint8)
    s = mx.array(rng.random((43, 384 // gs)) * 0.02 + 0.002).astype(scale_dtype)
    b = mx.array(rng.standard_normal((43, 384 // gs)) * 0.05).astype(scale_dtype)
    x = _x(9, 384, seed=gs)
    for rows in (1, 2, 4, 7, 9):
        assert mx.array_equal(qmv_ext.quantized_matmul(x[:rows], mx.array(pack(q, 5)), s, b, gs, 5),
                              qmv_ext.quantized_matmul(x[:rows], mx.array(pack(q, 8)), s, b, gs, 8)).item(), rows


@pytest.mark.parametrize("bits", [5, 3, 6])
def test_each_row_of_a_packed_product_is_that_row_alone_bit_for_bit(bits):
    # batch invariance across the lone row's loop and the band loops (2-7 rows, then from 8 the
    # operands made once a band), on Gemma 3's q-projection shape
    if bits not in qmv_ext.BITS:
        pytest.skip(f"{bits}-bit weights are MLX's own op with {qmv_ext.kernel_name()!r}")
    packed, _, s, b, centre = _layer(1024, 640, bits, True, mx.float16, seed=bits)
    x = _x(11, 640, seed=bits)
    alone = mx.concatenate([qmv_ext.quantized_matmul(x[i:i + 1], packed, s, b, 32, bits, centre) for i in range(11)])
    for rows in (2, 5, 8, 11):
        assert mx.array_equal(qmv_ext.quantized_matmul(x[:rows], packed, s, b, 32, bits, centre), alone[:rows]).item()


def test_fast_bits_are_the_widths_a_lone_row_reads_packed():
    # what mlxrt's GGUF conversion serves as stored (mlxrt.loading.gguf_quant.kernel_widths):
    # 4 and 8 everywhere, 3/5/6 only where the AVX-512 kernel unpacks them in registers (VBMI)
    assert set(qmv_ext.FAST_BITS) <= set(qmv_ext.BITS) and {4, 8} <= set(qmv_ext.FAST_BITS)
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    vbmi = qmv_ext.kernel_name() == "avx512 vnni" and " avx512vbmi" in flags
    assert qmv_ext.FAST_BITS == ((3, 4, 5, 6, 8) if vbmi else (4, 8))
