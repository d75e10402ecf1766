"""GGUF tensor types -> MLX weights: which MLX layout each ggml type becomes, and the conversion.

MLX's affine layout (``mx.quantize``) stores, per group of 32 weights, a float ``scale`` and
``bias`` and ``bits``-bit integers ``q`` (``w = scale * q + bias``), packed little-endian into
uint32 words. Every ggml type whose blocks are affine groups of 32 maps onto it without loss:

* ``Q4_0``/``Q5_0``/``Q8_0`` (``w = d * (q - 2^(b-1))``): scale ``d``, bias ``-2^(b-1) d``;
* ``Q4_1``/``Q5_1`` (``w = d * q + m``): scale ``d``, bias ``m``;
* ``Q4_K``/``Q5_K``: each 256-weight super-block holds eight sub-blocks of 32 whose 6-bit
  scale and min combine with the super-block's ``d``/``dmin`` into ``d*sc`` and ``-dmin*m``;
* ``IQ4_NL``/``IQ4_XS``: ``w = s * k[q]`` with ``k`` llama.cpp's 16 signed 8-bit levels, so
  ``k[q] + 128`` is an 8-bit integer: 8-bit MLX groups with scale ``s`` and bias ``-128 s``
  hold the very same values (twice the bytes of the 4-bit original; a 4-bit affine grid cannot
  hold a non-uniform one).

The integers are recovered from gguf's own dequantization (``round((w - bias) / scale)``), which
is exact: gguf computes ``w`` in float32, within far less than half a step of the grid.

Types whose groups are 16 weights wide (``Q2_K``, ``Q3_K``, ``Q6_K``: MLX's smallest group is 32)
or non-affine (the other ``IQ`` types, ``TQ``, ``MXFP4``) are dequantized and re-quantized by
``mx.quantize`` at the bit width in :data:`LAYOUTS`, chosen by the weight error measured in
docs/models.md. ``F32``/``F16``/``BF16`` stay floating point.

Where the mlxrt-qmv CPU kernel runs (:func:`kernel_widths`), a width whose one-row product it does
not compute fast is widened to 8 bits (:func:`served_layout`): the integers as they are, 8-bit
words. Its 4- and 8-bit loops are fast everywhere; a lossless 5-bit layer (``Q5_0``, ``Q5_1``,
``Q5_K``: Gemma 3's q/k/v/gate/up projections in a Q4_K_M file, hidden size 640 being no multiple
of 256) stays 5 bits where the kernel unpacks 5-bit rows in registers (AVX-512 VBMI, mlxrt-qmv
API 8's ``FAST_BITS``): a 2048x640 product for one row of x took 40-42 µs there against 51-55
widened (125-127 with the buffer-unpacking loop, hence the widening before), and Gemma 3 270M's
81 Q5_0 layers hold 39.6 MB of packed weights instead of 63.4, which each decode step reads
(docs/performance.md, "5-bit weights unpacked in registers").
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxrt.loading.gguf_format import UnsupportedGGUF

__all__ = ["GROUP_SIZE", "KERNEL_BITS", "Layout", "LAYOUTS", "layout_of", "served_layout", "kernel_widths",
           "converted_bytes", "mlx_tensor", "pack"]

#: Every MLX group the converter writes is 32 weights (ggml's smallest block).
GROUP_SIZE = 32


@attrs.frozen
class Layout:
    """What one ggml type becomes: ``bits`` of MLX affine groups (``None``: a float array) and
    whether the values are exactly the GGUF's (``lossless``)."""

    bits: int | None
    lossless: bool

    def bytes_per_weight(self, float_bytes: int) -> float:
        """Bytes per weight once converted, scales and biases (``float_bytes`` each) included."""
        if self.bits is None:
            return float(float_bytes)
        return self.bits / 8 + 2 * float_bytes / GROUP_SIZE


LAYOUTS: dict[str, Layout] = {
    "F32": Layout(None, True),
    "F16": Layout(None, True),
    "BF16": Layout(None, True),
    "Q4_0": Layout(4, True),
    "Q4_1": Layout(4, True),
    "Q5_0": Layout(5, True),
    "Q5_1": Layout(5, True),
    "Q8_0": Layout(8, True),
    "Q4_K": Layout(4, True),
    "Q5_K": Layout(5, True),
    "IQ4_NL": Layout(8, True),
    "IQ4_XS": Layout(8, True),
    # groups of 16 or non-affine levels: re-quantized (docs/models.md has the measured loss)
    "Q6_K": Layout(8, False),
    "Q3_K": Layout(5, False),
    "Q2_K": Layout(6, False),
    "IQ3_S": Layout(5, False),
    "IQ3_XXS": Layout(5, False),
    "IQ2_S": Layout(4, False),
    "IQ2_XS": Layout(4, False),
    "IQ2_XXS": Layout(4, False),
    "IQ1_S": Layout(4, False),
    "IQ1_M": Layout(4, False),
    "TQ1_0": Layout(2, False),
    "TQ2_0": Layout(2, False),
    "MXFP4": Layout(8, False),
}


#: The widths every mlxrt-qmv CPU kernel computes fast (its 4- and 8-bit loops).
KERNEL_BITS = (4, 8)


def kernel_widths() -> tuple[int, ...] | None:
    """The widths conversions here may serve as stored (:func:`served_layout`): ``None`` where
    MLX's own layers run (a GPU, or no mlxrt-qmv kernel loaded), else the kernel's ``FAST_BITS``:
    :data:`KERNEL_BITS`, and 3, 5 and 6 where it unpacks those in registers for up to 7 rows
    of x (AVX-512 VBMI). Part of the conversion cache's key (``mlxrt.loading.resolve``) and the
    converted folder's marker: a conversion made for another kernel is made again.

    Widening is what the kernel's speed asks for: its 8-bit product is ~6x faster than MLX's own
    CPU path for the 5-bit layers a Q4_K_M file brings (Gemma 3 270M: 44.8 against 7.5 tokens/s,
    docs/models.md), and its 5-bit one without VBMI ~2.4x slower than the widened 8-bit one."""
    import mlx.core as mx

    import mlxrt.engine.qmv as qmv

    st = qmv.load()
    if mx.default_device() != mx.cpu or not st.active:
        return None
    return tuple(st.module.FAST_BITS)


def served_layout(type_name: str, kernel: tuple[int, ...] | None) -> Layout:
    """:data:`LAYOUTS`' layout as a conversion for ``kernel`` (:func:`kernel_widths`; ``None``:
    no kernel, every layout as it is) writes it: widened to 8 bits where its width is not in
    :data:`KERNEL_BITS`, unless it is lossless and ``kernel`` computes that width fast (a Q5_0
    layer stays 5 bits on AVX-512 VBMI). A widened lossless layout stays lossless (its integers fit
    8 bits as they are); a re-quantized one is re-quantized at 8 bits (less error, so a Q3_K layer
    is 8 bits, not 5, whatever the kernel)."""
    layout = LAYOUTS[type_name]
    if kernel is None or layout.bits is None or layout.bits in KERNEL_BITS:
        return layout
    if layout.lossless and layout.bits in kernel:
        return layout
    return Layout(8, layout.lossless)


def layout_of(tensor: str, type_name: str) -> Layout:
    try:
        return LAYOUTS[type_name]
    except KeyError:
        raise UnsupportedGGUF(f"tensor {tensor!r} has GGUF type {type_name}, which is not supported; "
                              f"supported types: {', '.join(LAYOUTS)}") from None


def converted_bytes(n_weights: int, type_name: str, float_bytes: int) -> int:
    """Bytes a tensor of ``n_weights`` takes once converted (what ``fit`` counts for a GGUF)."""
    return int(n_weights * layout_of("?", type_name).bytes_per_weight(float_bytes))


def pack(q: Any, bits: int) -> Any:
    """Pack integers ``q`` (rows, cols), each < 2**bits, as ``mx.quantize`` does: a little-endian
    bit stream per row, read as uint32 words."""
    import numpy as np

    rows, cols = q.shape
    if bits in (2, 4, 8):
        per = 32 // bits
        words = q.reshape(rows, cols // per, per).astype(np.uint32) << (np.arange(per, dtype=np.uint32) * bits)
        return np.bitwise_or.reduce(words, axis=-1)
    stream = ((q[..., None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8)
    packed = np.packbits(stream.reshape(rows, cols * bits), axis=-1, bitorder="little")
    return packed.view("<u4")


def _f16(a: Any) -> Any:
    import numpy as np

    return np.ascontiguousarray(a).view(np.float16).astype(np.float32)[..., 0]


def _scale_bias(type_name: str, blocks: Any) -> tuple[Any, Any]:
    """Per group of 32: the float32 scale and bias of a lossless type's blocks (n, block bytes)."""
    import numpy as np
    from gguf.quants import Q4_K

    d = _f16(blocks[:, 0:2])[:, None]
    if type_name in ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL"):
        offset = {"Q4_0": 8.0, "Q5_0": 16.0, "Q8_0": 128.0, "IQ4_NL": 128.0}[type_name]
        return d, -offset * d
    if type_name in ("Q4_1", "Q5_1"):
        return d, _f16(blocks[:, 2:4])[:, None]
    if type_name in ("Q4_K", "Q5_K"):
        sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        return d * sc.astype(np.float32), -_f16(blocks[:, 2:4])[:, None] * mn.astype(np.float32)
    if type_name == "IQ4_XS":
        high = np.ascontiguousarray(blocks[:, 2:4]).view("<u2").astype(np.int32)  # (n, 1)
        low = blocks[:, 4:8].astype(np.int32)
        ib = np.arange(8)
        ls = ((low[:, ib // 2] >> (4 * (ib % 2))) & 0xF) | (((high >> (2 * ib)) & 3) << 4)
        s = d * (ls - 32).astype(np.float32)
        return s, -128.0 * s
    raise AssertionError(type_name)


def _dequantize(type_name: str, raw: Any, cols: int) -> Any:
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if type_name == "F32":
        return np.asarray(raw, np.float32)
    if type_name == "F16":
        return np.asarray(raw).astype(np.float32)
    return dequantize(np.asarray(raw), GGMLQuantizationType[type_name]).reshape(raw.shape[0], cols)


def mlx_tensor(name: str, type_name: str, raw: Any, shape: tuple[int, ...], float_dtype: Any,
               layout: Layout | None = None) -> dict[str, Any]:
    """One GGUF tensor as MLX arrays: ``{"weight": …}`` for a float layout, else
    ``{"weight", "scales", "biases"}`` (the ``shape``'s leading dims kept; mx.quantize's layout).

    ``raw`` is :meth:`GGUFFile.raw`'s view; rows are converted a slice at a time so the float32
    copy of a tensor never exists whole. ``layout`` defaults to :data:`LAYOUTS`' for the type.
    """
    import mlx.core as mx
    import numpy as np

    layout = layout or layout_of(name, type_name)
    cols = shape[-1]
    if layout.bits is None:
        if type_name not in ("F32", "F16", "BF16"):  # kept dequantized
            w = mx.array(_dequantize(type_name, raw, cols).reshape(shape))
        elif type_name == "BF16":
            w = mx.array(np.asarray(raw).view(np.uint16).reshape(shape)).view(mx.bfloat16)
        else:
            w = mx.array(np.asarray(raw).reshape(shape))
        if float_dtype is None or (type_name == "BF16" and float_dtype == mx.float16):
            return {"weight": w}  # bfloat16 stays: float16 has neither its range nor its rounding
        return {"weight": w.astype(float_dtype)}
    if cols % GROUP_SIZE:
        raise UnsupportedGGUF(f"tensor {name!r}: rows of {cols} weights are not whole groups of {GROUP_SIZE}")
    rows = raw.shape[0]
    step = max(1, (1 << 22) // cols)  # ~16 MB of float32 per slice
    ws, ss, bs = [], [], []
    for r0 in range(0, rows, step):
        part = raw[r0:r0 + step]
        w = _dequantize(type_name, part, cols)
        if layout.lossless:
            blocks = np.asarray(part).reshape(-1, part.shape[1] // (cols // _block_weights(type_name)))
            scale, bias = _scale_bias(type_name, blocks)
            scale = scale.reshape(part.shape[0], cols // GROUP_SIZE)
            bias = bias.reshape(part.shape[0], cols // GROUP_SIZE)
            g = w.reshape(part.shape[0], cols // GROUP_SIZE, GROUP_SIZE)
            safe = np.where(scale == 0, 1.0, scale)[..., None]
            q = np.rint((g - bias[..., None]) / safe)
            q = np.where(scale[..., None] == 0, 0, q)
            q = np.clip(q, 0, (1 << layout.bits) - 1).astype(np.uint8).reshape(part.shape[0], cols)
            ws.append(mx.array(pack(q, layout.bits)))
            ss.append(mx.array(scale))
            bs.append(mx.array(bias))
        else:
            wq, sc, bi = mx.quantize(mx.array(w), group_size=GROUP_SIZE, bits=layout.bits)
            ws.append(wq)
            ss.append(sc)
            bs.append(bi)
    lead = tuple(shape[:-1])
    out = {"weight": mx.concatenate(ws).reshape(*lead, -1),
           "scales": mx.concatenate(ss).reshape(*lead, -1),
           "biases": mx.concatenate(bs).reshape(*lead, -1)}
    if float_dtype is not None:
        out["scales"] = out["scales"].astype(float_dtype)
        out["biases"] = out["biases"].astype(float_dtype)
    return out


def _block_weights(type_name: str) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
