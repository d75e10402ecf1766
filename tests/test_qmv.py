"""The mlxrt-qmv kernel (kernels/mlxrt-qmv): its products equal MLX's own, mlxrt swaps it into a
quantized model's layers without changing greedy tokens, ``--dtype auto`` weighs it by measurement,
and ``--version`` / ``/stats`` say whether it is there. The kernel's tests skip where it is not
built; the last one checks mlxrt without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from support import greedy, primitive_counts, tiny_quantized_llama

from mlxrt.engine import qmv
from mlxrt.loading.dtype_choice import DtypeFacts, Machine, Timing, choose_dtype, decide, time_paths
from mlxrt.records import ModelInfo

try:
    import mlxrt_qmv as qmv_ext
except ImportError:
    qmv_ext = None
needs_kernel = pytest.mark.skipif(qmv_ext is None, reason="mlxrt-qmv is not built (scripts/setup builds it with a compiler)")
MLXRT_BIN = str(Path(sys.executable).parent / "mlxrt")


def _quantized(n: int, k: int, gs: int, bits: int, dtype=mx.float32, seed: int = 0):
    mx.random.seed(seed)
    w = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
    return mx.quantize(w, group_size=gs, bits=bits)


KERNEL = qmv_ext.kernel_name() if qmv_ext is not None else ""
#: The integer kernels round x to integers in [-STEPS, STEPS] per block of 32: the default ones
#: ("avx512 vnni", "avx2 int8", "portable int8") to 8 bits, "avx2 q15" (MLXRT_QMV_EXACT=1 on
#: AVX2) to 15. The float kernels round nothing (STEPS 0).
STEPS = 127 if "int8" in KERNEL or "vnni" in KERNEL else 16256 if "q15" in KERNEL else 0
INT8 = STEPS > 0


def _int8_bound(x, w, s, b, gs, bits):
    """The most an integer kernel may differ from the exact product, row by row of the output. It
    rounds x in blocks of 32 to multiples of d = max|x_block| / STEPS, so each element moves by at
    most d / 2, and its product is w . x_rounded exactly (the biases meet the rounded x's sums), so
    the error w . (x_rounded - x) is at most sum_k d_k / 2 * |w_k|."""
    x = x.astype(mx.float32).reshape(-1, x.shape[-1])
    k = x.shape[-1]
    half_d = mx.repeat(mx.abs(x.reshape(-1, k // 32, 32)).max(axis=-1) / (2 * STEPS), 32, axis=-1)
    dq = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=gs, bits=bits)
    return half_d @ mx.abs(dq).T


def _close_to_mlx(x, w, s, b, gs, bits, got):
    ref = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    scale = mx.abs(ref).max().item() + 1e-6
    if not INT8:  # a float kernel: MLX's product to float rounding
        assert mx.allclose(got, ref, rtol=1e-4, atol=1e-5 * scale).item(), mx.abs(got - ref).max().item()
        return
    err = mx.abs(got - ref).reshape(-1, ref.shape[-1])
    bound = _int8_bound(x, w, s, b, gs, bits) + 1e-5 * scale  # + float rounding of both sums
    assert (err <= bound).all().item(), (err - bound).max().item()


# N x K pairs per group size: odd row counts, K an odd number of 64-element blocks (the AVX2
# kernel's tail at group size 32), and SmolLM2's 1536x576 / 576x1536.
SHAPES = {32: [(7, 96), (33, 160), (1536, 576), (576, 1536)], 64: [(5, 192), (576, 1536)], 128: [(9, 384), (130, 256)]}


@needs_kernel
@pytest.mark.parametrize("bits", [3, 5, 6])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_k_quant_conversion_s_widths_equal_mlx_quantized_matmul(bits, rows):
    # 3-, 5- and 6-bit layers: the 8-bit kernels' portable loops (MLX's own op elsewhere)
    if bits not in qmv_ext.BITS:
        pytest.skip(f"{bits}-bit weights are MLX's own op with {KERNEL!r}")
    for gs in (32, 64, 128):
        for n, k in SHAPES[gs]:
            w, s, b = _quantized(n, k, gs, bits, seed=rows)
            x = mx.random.normal((rows, k))
            assert qmv_ext.supported(x, w, gs, bits)
            _close_to_mlx(x, w, s, b, gs, bits, qmv_ext.quantized_matmul(x, w, s, b, gs, bits))


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("gs", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_float32_products_equal_mlx_quantized_matmul(bits, gs, rows):
    for n, k in SHAPES[gs]:
        w, s, b = _quantized(n, k, gs, bits, seed=rows)
        x = mx.random.normal((rows, k))
        assert qmv_ext.supported(x, w, gs, bits)
        _close_to_mlx(x, w, s, b, gs, bits, qmv_ext.quantized_matmul(x, w, s, b, gs, bits))


@needs_kernel
@pytest.mark.skipif(not INT8, reason="the float kernels (on request only) sum a row in as many chains as the "
                                     "registers allow for the rows beside it")
@pytest.mark.parametrize("bits", [4, 8, 5, 6])
@pytest.mark.parametrize("gs", [32, 64, 128])
def test_each_row_of_a_product_is_that_row_s_product_alone_bit_for_bit(bits, gs):
    # A batch's decode step multiplies its rows together and a lone stream's one row; the integer
    # kernels have a loop for each (one row, up to four), and a seeded request must return the
    # same text alone and under load (tests/test_batching.py), so every row's bits are its own.
    # The 8-bit kernels take any number of rows (a prefill, newcomers' prefills as one product):
    # 70 rows cross their blocks of 64 rows of x.
    if bits not in qmv_ext.BITS:
        pytest.skip(f"{bits}-bit weights are MLX's own op with {KERNEL!r}")
    rows = 70 if qmv_ext.MAX_ROWS >= 70 else 13
    for n, k in SHAPES[gs]:
        w, s, b = _quantized(n, k, gs, bits, seed=n)
        x = mx.random.normal((rows, k))
        together = qmv_ext.quantized_matmul(x, w, s, b, gs, bits)
        for i in range(0, x.shape[0], 3 if rows > 13 else 1):
            alone = qmv_ext.quantized_matmul(x[i:i + 1], w, s, b, gs, bits)
            assert mx.array_equal(together[i:i + 1], alone).item(), (n, k, i)
        assert mx.array_equal(together[5:11], qmv_ext.quantized_matmul(x[5:11], w, s, b, gs, bits)).item()


@needs_kernel
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_half_precision_is_at_least_as_close_to_the_exact_product_as_mlx(dtype, bits):
    # MLX accumulates in the half type; the kernel in float32 (or int32 per block), rounding once
    # at the end.
    w, s, b = _quantized(576, 1536, 64, bits, dtype)
    x = mx.random.normal((3, 1536)).astype(dtype)
    exact = x.astype(mx.float32) @ mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=64,
                                                 bits=bits).T
    ref = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=bits)
    got = qmv_ext.quantized_matmul(x, w, s, b, 64, bits)
    assert got.dtype == dtype
    ulp = 2.0 ** (-8 if dtype == mx.bfloat16 else -11) * mx.abs(exact).max().item()
    err = mx.abs(got.astype(mx.float32) - exact)
    if INT8:  # within the int8 rounding bound, plus one rounding to the half type
        assert (err <= _int8_bound(x, w, s, b, 64, bits) + ulp).all().item()
    else:
        assert err.max().item() <= max(mx.abs(ref.astype(mx.float32) - exact).max().item(), ulp)


@needs_kernel
def test_leading_dimensions_strided_x_and_what_it_leaves_to_mlx():
    w, s, b = _quantized(96, 128, 32, 4)
    x = mx.random.normal((2, 3, 128))
    _close_to_mlx(x, w, s, b, 32, 4, qmv_ext.quantized_matmul(x, w, s, b, 32, 4))
    strided = mx.random.normal((128, 4)).T  # 4 rows of 128, not row contiguous
    _close_to_mlx(strided, w, s, b, 32, 4, qmv_ext.quantized_matmul(strided, w, s, b, 32, 4))
    many = mx.random.normal((qmv_ext.MAX_ROWS + 1 if qmv_ext.MAX_ROWS < 1000 else 100, 128))
    # past MAX_ROWS (32 for the 15-bit and float kernels) mx.quantized_matmul computes it
    assert qmv_ext.supported(many, w, 32, 4) is (qmv_ext.MAX_ROWS >= many.shape[0])
    _close_to_mlx(many, w, s, b, 32, 4, qmv_ext.quantized_matmul(many, w, s, b, 32, 4))
    w3, s3, b3 = mx.quantize(mx.random.normal((64, 128)), group_size=32, bits=3)
    assert qmv_ext.supported(x, w3, 32, 3) is (3 in qmv_ext.BITS)  # 3-bit: the 8-bit kernels' portable loops
    w2, _, _ = mx.quantize(mx.random.normal((64, 128)), group_size=32, bits=2)
    assert not qmv_ext.supported(x, w2, 32, 2)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_dequantize_equals_mlx(bits, dtype):
    for gs, (n, k) in [(32, (33, 160)), (64, (5, 192)), (128, (9, 384))]:
        w, s, b = _quantized(n, k, gs, bits, dtype)
        got, ref = qmv_ext.dequantize(w, s, b, gs, bits), mx.dequantize(w, s, b, group_size=gs, bits=bits)
        assert got.dtype == ref.dtype and mx.allclose(got, ref, rtol=1e-3, atol=1e-3).item()


@needs_kernel
@pytest.mark.parametrize("kernel", ["generic", "avx2+fma"])
def test_the_float_kernels_give_mlx_s_products(kernel):
    # MLXRT_QMV_KERNEL picks a float kernel: the portable one, or the x86-64 float one (the exact
    # path beside the default int8 one); both equal MLX's products to float rounding.
    if kernel == "avx2+fma" and not (KERNEL.startswith("avx2") or KERNEL.startswith("avx512")):
        pytest.skip(f"no AVX2 loops in this process ({KERNEL!r})")
    code = ("import mlx.core as mx, mlxrt_qmv as q, sys\n"
            "assert q.kernel_name() == sys.argv[1], q.kernel_name()\n"
            "for bits in (4, 8):\n"
            "  for gs, n, k in ((32, 130, 96), (32, 33, 160), (64, 5, 192), (128, 130, 256)):\n"
            "    w, s, b = mx.quantize(mx.random.normal((n, k)), group_size=gs, bits=bits)\n"
            "    for rows in (1, 3, 8):\n"
            "      x = mx.random.normal((rows, k))\n"
            "      ref = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)\n"
            "      assert mx.allclose(q.quantized_matmul(x, w, s, b, gs, bits), ref, rtol=1e-4, atol=1e-4).item()\n"
            "    assert mx.allclose(q.dequantize(w, s, b, gs, bits), mx.dequantize(w, s, b, group_size=gs, bits=bits), atol=1e-5).item()\n")
    run = subprocess.run([sys.executable, "-c", code, kernel], env={**os.environ, "MLXRT_QMV_KERNEL": kernel},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


@needs_kernel
@pytest.mark.parametrize("forced", ["portable", "avx2 int8", "exact", "generic"])
def test_the_other_loops_keep_within_their_rounding_bound_row_by_row(forced):
    # The kernel is chosen once, at load: this file's product tests run again in a process with
    # another one forced (MLXRT_QMV_KERNEL / MLXRT_QMV_EXACT): the portable loops (as on a CPU
    # without AVX2), the AVX2 ones where this CPU has AVX-512, the exact path (x in 15 bits on
    # AVX2) and the portable float loops (the exact path without AVX2; a prefill of 9-32 rows
    # overran their eight accumulators before mlxrt-qmv 0.5). Each holds its products to its _int8_bound (STEPS from
    # its name) and, where it is an integer kernel, every row to that row alone.
    env = {k: v for k, v in os.environ.items() if k not in ("MLXRT_QMV_EXACT", "MLXRT_QMV_KERNEL")}
    env.update({"MLXRT_QMV_EXACT": "1"} if forced == "exact" else {"MLXRT_QMV_KERNEL": forced})
    code = "import mlxrt_qmv as q; print(q.kernel_name())"
    name = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120).stdout.strip()
    if name == KERNEL or (forced not in ("portable", "generic") and not name.startswith("avx2")):
        pytest.skip(f"{forced!r} is {name!r} here, the default or not this CPU's")
    run = subprocess.run([str(Path(sys.executable).parent / "pytest"), "-q", "-p", "no:cacheprovider", __file__,
                          "-k", "equal_mlx_quantized_matmul or row_s_product_alone or half_precision or leading_dimensions "
                                "or greedy_tokens or half_scales or tokens_alike"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-3000:]


def _tiny_quantized_model() -> nn.Module:
    # 4-bit layers, the embedding (and so the tied head) at 8 bits, as in a GGUF Q4_1 + Q8_0 file
    return tiny_quantized_llama(4, 8, seed=3)


@needs_kernel
@pytest.mark.parametrize("half", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("bits, gs", [(4, 32), (8, 32), (4, 64), (8, 128)])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_half_scales_beside_float32_x_are_the_float32_scales_bits(half, bits, gs, rows):
    # A GGUF's block scales are float16: install() keeps a layer's scales and biases in 16 bits
    # where every value is exact there (a third of a 4-bit layer's bytes at group 32), and the
    # kernel reads them beside float32 x (API 7): a float32 product, the same bits as with the
    # values widened to float32 first, for a decode step's one row (read in place), a few and a
    # prefill's many. K = 608: 19 blocks, so the last chunk of a 4-bit row is partial.
    for k in (576, 608) if gs == 32 else (640,):
        w, s, b = mx.quantize(mx.random.normal((37, k), key=mx.random.key(bits + gs)), group_size=gs, bits=bits)
        s, b = s.astype(half), b.astype(half)
        x = mx.random.normal((rows, k), key=mx.random.key(rows))
        got = qmv_ext.quantized_matmul(x, w, s, b, gs, bits)
        want = qmv_ext.quantized_matmul(x, w, s.astype(mx.float32), b.astype(mx.float32), gs, bits)
        assert got.dtype == mx.float32
        assert mx.array_equal(got, want).item(), (k, mx.abs(got - want).max().item())
        # a symmetric format's biases (-centre * scales): the lone row's loops compute them
        b = (s.astype(mx.float32) * -16.0).astype(half)
        assert mx.array_equal(qmv_ext.quantized_matmul(x, w, s, b, gs, bits, 16.0),
                              qmv_ext.quantized_matmul(x, w, s, b, gs, bits)).item()


@needs_kernel
def test_install_keeps_scales_in_16_bits_where_they_are_exact_and_the_tokens_alike():
    model = _tiny_quantized_model()
    layers = dict(model.named_modules())
    # as a GGUF's Q4_1/Q8_0 blocks store them: float16 values (held as float32 after the load)
    exact = ["model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]
    for name in exact:
        layer = layers[name]
        layer.update({key: layer[key].astype(mx.float16).astype(mx.float32) for key in ("scales", "biases")})
    # and one symmetric, as a Q5_0 layer widened to 8 bits: biases -16 times the scales
    symmetric = layers["model.layers.1.mlp.down_proj"]
    symmetric.update({"biases": symmetric["scales"] * -16.0})
    mx.eval(model.parameters())
    prompt = list(range(5, 45))
    before, long_before = greedy(model, prompt, 12), greedy(model, list(range(5, 85)), 4)
    embedded = model.model.embed_tokens(mx.array([[3, 7]]))
    qmv.install(model)
    layers = dict(model.named_modules())
    for name, layer in layers.items():
        if "scales" in layer:
            assert layer["scales"].dtype == (mx.float16 if name in exact else mx.float32), name
            assert layer["biases"].dtype == layer["scales"].dtype
            assert getattr(layer, "bias_centre", 0.0) == (16.0 if name == "model.layers.1.mlp.down_proj" else 0.0), name
    # the embedding's rows (looked up, not multiplied) stay float32, the same values
    looked_up = model.model.embed_tokens(mx.array([[3, 7]]))
    assert looked_up.dtype == mx.float32 and mx.array_equal(looked_up, embedded).item()
    assert greedy(model, prompt, 12) == before and greedy(model, list(range(5, 85)), 4) == long_before


@needs_kernel
def test_install_swaps_layers_and_greedy_tokens_stay_the_same():
    model = _tiny_quantized_model()
    prompt = list(range(5, 45))  # 40 tokens: the prefill runs the kernel (in two pieces for q15)
    long = list(range(5, 85))  # 80: the 8-bit kernels' way, or dequantize + BLAS for the others
    before, long_before = greedy(model, prompt, 12), greedy(model, long, 4)
    logits_before = model(mx.array([prompt[:3]]))
    count = qmv.install(model)
    # 7 linear layers a block, 2 blocks, and the embedding (its as_linear is the tied head)
    assert count == 2 * 7 + 1
    kinds = {type(m).__name__ for _, m in model.named_modules()}
    assert {"KernelQuantizedLinear", "KernelQuantizedEmbedding"} <= kinds and "QuantizedLinear" not in kinds
    assert all(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules()
               if type(m).__name__ == "KernelQuantizedLinear")
    assert greedy(model, prompt, 12) == before and greedy(model, long, 4) == long_before
    logits = model(mx.array([prompt[:3]]))
    if INT8:
        # x rounded to int8 per block of 32 moves each product by ~0.1-0.3% of its size (see
        # _int8_bound); through two blocks that leaves the logits within 2-3%, their order alike;
        # rounded to 15 bits, 128 times less.
        err = mx.abs(logits - logits_before).max().item() / mx.abs(logits_before).max().item()
        assert err < (0.05 if STEPS == 127 else 1e-3), err
        assert mx.array_equal(mx.argmax(logits, -1), mx.argmax(logits_before, -1)).item()
    else:
        assert mx.allclose(logits, logits_before, rtol=1e-4, atol=1e-4).item()


@needs_kernel
def test_installed_layers_run_the_kernel_in_pieces_up_to_kernel_rows_then_the_blas():

    mx.random.seed(3)
    layer = nn.QuantizedLinear(160, 96, bias=False, group_size=32, bits=4)
    w, s, b = layer["weight"], layer["scales"], layer["biases"]
    model = nn.Sequential(layer)
    assert qmv.install(model) == 1
    layer = model.layers[0]  # a kernel layer in its place (Module.update_modules), the same parameters
    assert type(layer) is not nn.QuantizedLinear and isinstance(layer, nn.QuantizedLinear)
    if getattr(layer, "band", 0):  # laid out in bands of rows where the kernel reads them so
        w_, s_, b_ = qmv_ext.band_rows(w, 4), qmv_ext.band_rows(s), qmv_ext.band_rows(b)
    else:
        w_, s_, b_ = w, s, b
    assert all(mx.array_equal(layer[key], old).item() for key, old in (("weight", w_), ("scales", s_), ("biases", b_)))
    for rows in (1, 32, 33, qmv.KERNEL_ROWS, qmv.KERNEL_ROWS + 1, 300):
        x = mx.random.normal((2, rows, 160))[1:]  # leading dimensions kept, a view
        got = layer(x)
        ops = primitive_counts(got)
        pieces = -(-rows // qmv_ext.MAX_ROWS)
        if qmv_ext.MAX_ROWS >= rows:  # the 8-bit kernels: one product, whatever the rows
            assert ops["MlxrtQuantizedMatvec"] == 1 and "MlxrtDequantize" not in ops, (rows, ops)
        elif rows <= qmv.KERNEL_ROWS:
            assert ops["MlxrtQuantizedMatvec"] == pieces and "MlxrtDequantize" not in ops, (rows, ops)
        else:
            assert "MlxrtQuantizedMatvec" not in ops and "MlxrtDequantize" in ops, (rows, ops)
        _close_to_mlx(x, w, s, b, 32, 4, got)


@needs_kernel
def test_auto_weighs_the_kernel_against_float32_by_measurement():
    facts = DtypeFacts("quantized 4-bit", 10**6, 0, 4096)
    machine = Machine(on_cpu=True, blas_fast=True, blas_name="MKL")
    keep = decide("auto", facts, machine, budget=10**9, timing=lambda: Timing(0.002, 0.006, "avx2+fma"))
    assert keep.cast is None and keep.reason.startswith("auto keeps the stored dtype, the faster: measured at load")
    cast = decide("auto", facts, machine, budget=10**9, timing=lambda: Timing(0.006, 0.002, "avx2+fma"))
    assert cast.cast == "float32" and "the faster: measured at load" in cast.reason

    def never():
        raise AssertionError("timed although the rule already keeps the stored dtype")

    assert decide("auto", facts, Machine(True, False, "bundled"), budget=10**9, timing=never).cast is None
    assert decide("stored", facts, machine, budget=10**9, timing=never).cast is None
    # on a real model: both paths timed on its own shapes
    model = _tiny_quantized_model()
    timing = time_paths(model, qmv_ext)
    assert timing is not None and timing.kernel_s > 0 and timing.float32_s > 0
    info = ModelInfo(model_id="m", path=None, model_type="llama", config={})
    choice = choose_dtype("auto", model, info, budget=10**9, blas_fast=True, blas_name="MKL", on_cpu=True,
                          kernel=qmv_ext)
    assert choice.cast is None or "measured at load" in choice.reason
    if qmv.known_faster(qmv_ext):  # the 8-bit kernels: the stored weights, nothing timed at start
        assert choice.cast is None and "not timed at load" in choice.reason and KERNEL in choice.reason
    else:
        assert "measured at load" in choice.reason
    assert time_paths(nn.Sequential(nn.Linear(8, 8)), qmv_ext) is None


@needs_kernel
def test_version_reports_the_kernel_and_mlxrt_qmv_0_turns_it_off():
    def version(**env: str) -> str:
        run = subprocess.run([MLXRT_BIN, "--version"], capture_output=True, text=True, cwd="/",
                             env={**os.environ, **env}, timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stdout

    from importlib.metadata import version as installed

    assert f"quantized kernel: mlxrt-qmv {installed('mlxrt-qmv')} ({qmv_ext.kernel_name()}, " in version()
    assert "quantized kernel: none (MLXRT_QMV=0)" in version(MLXRT_QMV="0")


@pytest.fixture(scope="module")
def q4_checkpoint(tmp_path_factory):
    """A tiny qwen3 checkpoint quantized to 4 bits, group 32, as mlx-lm saves one."""
    import shutil

    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    from mlxrt.testing import write_tiny_checkpoint

    src = write_tiny_checkpoint(tmp_path_factory.mktemp("f32") / "qwen3", "qwen3")
    folder = tmp_path_factory.mktemp("q4") / "qwen3-q4"
    model, config = load_model(src)
    model, config = quantize_model(model, config, group_size=32, bits=4)
    save_model(folder, model)
    save_config(config, folder / "config.json")
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja") and not (folder / f.name).exists():
            shutil.copy(f, folder / f.name)
    return folder


@needs_kernel
def test_served_quantized_model_answers_alike_with_and_without_the_kernel(q4_checkpoint, server_process):
    import httpx

    body = {"prompt": "one two three", "max_tokens": 16, "temperature": 0}
    answers = {}
    for name, env in (("kernel", {}), ("mlx", {"MLXRT_QMV": "0"})):
        server = server_process([str(q4_checkpoint), "--dtype", "stored"], env=env)
        stats = httpx.get(f"{server.url}/stats", timeout=30).json()
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        answers[name] = reply.json()["choices"][0]["text"]
        assert stats["quantized_kernel"]["active"] is (name == "kernel")
        log = server.stop()
        assert ("quantized kernel: mlxrt-qmv" in log) is (name == "kernel")
    assert answers["kernel"] == answers["mlx"] and answers["kernel"]


def test_without_the_kernel_mlxrt_keeps_mlx_s_own_layers():
    code = ("import sys; sys.modules['mlxrt_qmv'] = None\n"
            "import mlx.nn as nn\n"
            "from mlxrt.engine import qmv\n"
            "st = qmv.status()\n"
            "assert not st.active and st.text == 'none (mlxrt-qmv not installed)', st.text\n"
            "assert st.as_dict()['active'] is False\n"
            "model = nn.Sequential(nn.Linear(64, 64))\n"
            "nn.quantize(model, group_size=32, bits=4)\n"
            "assert qmv.install(model) == 0 and type(model.layers[0]) is nn.QuantizedLinear\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_a_kernel_of_another_api_version_is_refused():
    # mlxrt uses one kernel interface (qmv.API); a build of another checkout (an older wheel left
    # in the environment, or one without the constant) is not used, and says how to fix it.
    import types

    def kernel(**attrs):
        return types.SimpleNamespace(kernel_name=lambda: "portable int8", threads=lambda: 2, **attrs)

    for module, found in ((kernel(API=qmv.API - 1), str(qmv.API - 1)), (kernel(API=qmv.API + 1), str(qmv.API + 1)),
                          (kernel(), "< 5")):
        st = qmv.accept(module)
        assert not st.active and st.module is None, st
        assert st.reason == (f"mlxrt-qmv has API version {found}, mlxrt requires {qmv.API}: "
                             "rebuild it with ./scripts/setup"), st.reason
    st = qmv.accept(kernel(API=qmv.API))
    assert st.active and st.kernel == "portable int8" and st.threads == 2
    # through the import: the status mlxrt reports, and one warning in the log
    code = ("import logging, sys, types; logging.basicConfig()\n"
            "sys.modules['mlxrt_qmv'] = types.SimpleNamespace(API=4, kernel_name=lambda: 'x', threads=lambda: 1)\n"
            "from mlxrt.engine import qmv\n"
            "print(qmv.status().text); qmv.status()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "MLXRT_QMV"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (f"none (mlxrt-qmv has API version 4, mlxrt requires {qmv.API}: rebuild it with "
                                  "./scripts/setup)"), run.stdout
    assert run.stderr.count("WARNING") == 1 and "API version 4, mlxrt requires" in run.stderr, run.stderr


@needs_kernel
def test_the_built_kernel_has_the_api_version_mlxrt_requires():
    assert qmv_ext.API == qmv.API and qmv.status().active


@needs_kernel
def test_callers_on_several_threads_get_their_own_products():
    # Several models' engine threads may call it at once (--max-models): the thread pool takes one
    # job at a time and the others compute alone.
    import threading

    w, s, b = _quantized(1536, 576, 32, 4)
    xs = [mx.random.normal((1, 576)) for _ in range(3)]
    refs = [qmv_ext.quantized_matmul(x, w, s, b, 32, 4) for x in xs]  # one caller alone
    mx.eval(w, s, b, xs, refs)
    wrong: list[int] = []

    def work(i: int) -> None:
        stream = mx.new_stream(mx.cpu)
        for _ in range(100):
            with mx.stream(stream):
                y = qmv_ext.quantized_matmul(xs[i], w, s, b, 32, 4)
                mx.eval(y)
            if not mx.array_equal(y, refs[i]).item():  # each output row is one thread's, in one order
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@needs_kernel
def test_qmv_default_is_the_8_bit_activations():
    """Without MLXRT_QMV_EXACT, mlxrt loads the kernel's 8-bit activations (runtime/engine/qmv.py);
    MLXRT_QMV_EXACT=1 gives the exact path. (mlxrt-qmv 0.5.0, whose 8-bit rounding lost Gemma 3's
    text, has API 5 and is refused: test_a_kernel_of_another_api_version_is_refused.)"""
    code = "from mlxrt.engine import qmv; print(qmv.load().kernel)"
    env = {k: v for k, v in os.environ.items() if k not in ("MLXRT_QMV_EXACT", "MLXRT_QMV_KERNEL")}
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    exact = subprocess.run([sys.executable, "-c", code], env={**env, "MLXRT_QMV_EXACT": "1"}, capture_output=True,
                           text=True, timeout=120)
    assert default.stdout.strip() in ("avx512 vnni", "avx2 int8", "portable int8"), default.stdout + default.stderr[-2000:]
    assert exact.stdout.strip() in ("avx2 q15", "generic"), exact.stdout + exact.stderr[-2000:]


# --- 8-bit activations on the layouts a GGUF conversion brings (issue 48) ---------------------


def _widened_layer(n: int, k: int, top: int, centre: int, seed: int):
    """A GGUF layer as mlxrt's converter serves it to the 8-bit kernels (runtime/sources/gguf_quant.py):
    integers 0..top (Q5_0: 31, a Q6_K-like 6-bit one: 63, Q8_0: 255), spread about ``centre`` as a
    trained layer's are, in 8-bit words, scale d per group of 32 and bias -centre * d."""
    import numpy as np

    rng = np.random.default_rng(seed)
    q = np.clip(np.rint(centre + rng.standard_normal((n, k)) * top / 6), 0, top).astype(np.uint32)
    words = np.bitwise_or.reduce(q.reshape(n, k // 4, 4) << (np.arange(4, dtype=np.uint32) * 8), axis=-1)
    d = (rng.random((n, k // 32)) * 0.02 + 0.002).astype(np.float32)
    return mx.array(words.astype(np.uint32)), mx.array(d), mx.array(-centre * d)


def _rounded_x(x):
    """x as the integer kernels round it (per block of 32, d = max|x| / STEPS, to nearest even),
    in float64: their product is exactly w . this (the float kernels': x itself)."""
    import numpy as np

    x = np.array(x, dtype=np.float32)
    if not INT8:
        return x.astype(np.float64)
    blocks = x.reshape(x.shape[0], -1, 32)
    am = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.where(am > 0, np.float32(STEPS) / np.where(am > 0, am, 1), 0).astype(np.float32)
    return (np.rint(blocks * inv) * (am / np.float32(STEPS))).astype(np.float64).reshape(x.shape)


@needs_kernel
@pytest.mark.parametrize("top, centre", [(31, 16), (63, 32), (255, 128)])
def test_widened_gguf_layers_equal_mlx_quantized_matmul_to_the_rounding_of_x(top, centre):
    # Gemma 3 270M Q4_K_M's q/k/gate/up projections are Q5_0 (hidden 640 is no multiple of 256),
    # served as 8-bit words holding 0..31 about 16; its activations have outliers hundreds of times
    # the rest. mlxrt-qmv 0.5.0 took every 8-bit layer's weights as q - 128 against x's rounding, 7-20
    # times a Q5_0 weight's size (greedy text left llama.cpp's on all 10 prompts); each product must
    # be w . x_rounded, the error llama.cpp's Q8 activations have too. The name puts it among the
    # tests that test_the_other_loops_keep_within_their_rounding_bound_row_by_row runs on the
    # portable, AVX2 and exact loops.
    import numpy as np

    n, k = 96, 640
    w, s, b = _widened_layer(n, k, top, centre, seed=top)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, k)).astype(np.float32)
    x[:, [7, 300, 613]] *= 400.0  # outliers: most of a block rounds to 0 beside one
    assert qmv_ext.supported(mx.array(x), w, 32, 8)
    got = np.array(qmv_ext.quantized_matmul(mx.array(x), w, s, b, 32, 8), dtype=np.float64)
    dq = np.array(mx.dequantize(w, s, b, group_size=32, bits=8), dtype=np.float64)
    ideal = _rounded_x(x) @ dq.T
    exact = x.astype(np.float64) @ dq.T
    scale = np.abs(exact).max()
    assert np.abs(got - ideal).max() <= 1e-4 * scale, (np.abs(got - ideal).max() / scale, np.abs(ideal - exact).max() / scale)


@needs_kernel
@pytest.mark.parametrize("bits", [3, 5, 6])
def test_k_quant_widths_equal_mlx_quantized_matmul_to_the_rounding_of_x(bits):
    # 3-, 5- and 6-bit layers on the AVX-512 loops (each band of weight rows unpacked to bytes, with
    # VBMI where the CPU has it, 64 values a step and a last 32) and the portable ones (forced by
    # test_the_other_loops_keep_within_their_rounding_bound_row_by_row): both w . x_rounded, so the
    # same products to float rounding, for one row of x and a prefill's many.
    import numpy as np

    if bits not in qmv_ext.BITS:
        pytest.skip(f"{bits}-bit weights are MLX's own op with {KERNEL!r}")
    for k, gs in ((672, 32), (640, 64)):  # 672: 10 steps of 64 values and a last 32
        w, s, b = _quantized(130, k, gs, bits, seed=bits)
        rng = np.random.default_rng(bits)
        for rows in (1, 70):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            x[:, 5] *= 300.0
            got = np.array(qmv_ext.quantized_matmul(mx.array(x), w, s, b, gs, bits), dtype=np.float64)
            dq = np.array(mx.dequantize(w, s, b, group_size=gs, bits=bits), dtype=np.float64)
            ideal = _rounded_x(x) @ dq.T
            scale = np.abs(x.astype(np.float64) @ dq.T).max()
            assert np.abs(got - ideal).max() <= 1e-4 * scale, (k, rows, np.abs(got - ideal).max() / scale)


# --- several rows' products: each band's operands made once (issue 48, prefill chunks) -------------


@needs_kernel
@pytest.mark.skipif(not INT8, reason="the float kernels' bits depend on the rows beside them")
@pytest.mark.parametrize("bits, gs, n, k", [(4, 32, 1536, 576), (4, 64, 43, 192), (8, 32, 2050, 576),
                                            (8, 128, 37, 384), (5, 32, 21, 160)])
def test_every_row_count_gives_each_row_its_bits_alone(bits, gs, n, k):
    # From 8 rows of x the AVX-512 loops make each band's unpacked weights and spread scales once
    # for all the rows (below that they make them in each tile), in tiles of up to 4 x 4; a row's
    # product must be its product alone at every row count, across both loops, the tile edges
    # (odd counts, a weight band of 43 rows), a last partial chunk (K = 192 at 4 bits and 160 at 5:
    # six and five blocks) and an 8-bit head shape, with x's scale varying by row.
    import numpy as np

    if bits not in qmv_ext.BITS:
        pytest.skip(f"{bits}-bit weights are MLX's own op with {KERNEL!r}")
    w, s, b = _quantized(n, k, gs, bits, seed=n + bits)
    rng = np.random.default_rng(n)
    x = mx.array((rng.standard_normal((33, k)) * rng.uniform(0.1, 8.0, (33, 1))).astype(np.float32))
    alone = mx.concatenate([qmv_ext.quantized_matmul(x[i:i + 1], w, s, b, gs, bits) for i in range(33)])
    for rows in (r for r in (2, 4, 7, 8, 9, 16, 33) if r <= qmv_ext.MAX_ROWS):  # the exact path: 32 at most
        got = qmv_ext.quantized_matmul(x[:rows], w, s, b, gs, bits)
        assert mx.array_equal(got, alone[:rows]).item(), rows
