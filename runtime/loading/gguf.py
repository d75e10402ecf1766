"""Convert a GGUF file into a Hugging Face style folder that mlx-lm loads.

``convert_gguf(gguf_path, out_dir)`` writes:

* ``config.json`` -- the architecture's HF config built from the GGUF metadata
  (:mod:`mlxrt.loading.gguf_arch`: llama/Mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3),
  plus an mlx-lm ``quantization`` block (the most common bits as the default, per-module
  overrides where a module's bits differ, ``false`` for modules kept in floating point);
* ``model.safetensors`` -- the mlx-lm parameter names; each tensor in the MLX layout its ggml
  type maps to (:mod:`mlxrt.loading.gguf_quant`: affine groups of 32 converted without loss,
  groups of 16 and non-affine types re-quantized), Q/K rows and Gemma's norms back in HF form;
* ``tokenizer.json`` / ``tokenizer_config.json`` -- the tokenizer rebuilt from
  ``tokenizer.ggml.*`` (:mod:`mlxrt.loading.gguf_tokenizer`), the chat template, BOS/EOS and
  the add-BOS flag;
* ``generation_config.json`` -- BOS/EOS ids, end-of-generation tokens included;
* ``mlxrt_gguf.json`` -- where the folder came from (source size and mtime, the tensor types
  and what each became), so a cache can tell when its source changed.

Floating-point tensors (norms, F16/F32 matrices, and the scales/biases of quantized ones) are
written as float16 when MLX runs on a GPU and as float32 on a CPU-only MLX (``dtype="auto"``,
see :func:`auto_float_dtype`). In float32 every lossless type's scale and bias is exact; in
float16 a K-quant's combined scale ``d * sc`` is rounded to float16 (a relative 2^-11 at most).

The module is light to import: mlx, numpy, gguf and tokenizers are imported inside the
functions that need them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import attrs

from mlxrt.loading.gguf_arch import llama3_rope_scaling, plan_architecture, unpermute_rows
from mlxrt.loading.gguf_format import GGUFFile, UnsupportedGGUF, read_gguf
from mlxrt.loading.gguf_quant import (
    GROUP_SIZE,
    KERNEL_BITS,
    kernel_widths,
    layout_of,
    mlx_tensor,
    served_layout,
)
from mlxrt.loading.gguf_tokenizer import build_tokenizer, tokenizer_config

__all__ = [
    "UnsupportedGGUF",
    "GGUFFile",
    "CONVERTER_VERSION",
    "MARKER_FILE",
    "auto_float_dtype",
    "read_gguf",
    "build_tokenizer",
    "convert_gguf",
    "llama3_rope_scaling",
]

#: Bumped whenever the output of :func:`convert_gguf` changes, so caches re-convert (4: a lossless
#: 5-bit layer stays 5 bits where the kernel computes it fast; the marker's ``kernel_widths`` is
#: that list of widths, or null, where it was a bool).
CONVERTER_VERSION = 4

#: Converted weights written per safetensors file (and so at most held in memory at once).
SHARD_BYTES = 1 << 30

#: Provenance file written into every converted folder.
MARKER_FILE = "mlxrt_gguf.json"

#: Token texts llama.cpp also ends generation on (it finds them by name, as here).
_END_OF_GENERATION = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|eom_id|>")


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def auto_float_dtype() -> str:
    """The float dtype ``dtype="auto"`` uses for quantized/F16 GGUFs on this machine.

    ``"float16"`` when MLX runs on a GPU.  On a CPU-only MLX, ``"float32"``: there
    MLX's float16 kernels (quantized matmul included) are ~25x slower than float32
    (SmolLM2-135M Q4_1: 0.2 vs 5.8 tok/s decode), and widening the f16 scales/biases
    to float32 is lossless.
    """
    import mlx.core as mx

    try:
        on_gpu = mx.default_device().type == mx.DeviceType.gpu
    except Exception:  # pragma: no cover - very old mlx
        on_gpu = False
    return "float16" if on_gpu else "float32"


def _write_weights(g: GGUFFile, plan: Any, target: Any, folder: Path,
                   kernel: tuple[int, ...] | None) -> dict[str, int | None]:
    """Convert every tensor into ``folder``'s ``model*.safetensors``; return each module's bits
    (``None``: kept in floating point). Shards of about :data:`SHARD_BYTES` are written as they
    fill, so converting never holds more than one shard of converted weights."""
    import mlx.core as mx

    config = plan.config
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    weights: dict[str, Any] = {}
    pending = 0
    shard = 0
    module_bits: dict[str, int | None] = {}  # HF module path -> bits / None (float)

    def flush() -> None:
        nonlocal shard, pending
        if weights:
            name = "model.safetensors" if shard == 0 else f"model-{shard + 1:05d}.safetensors"
            mx.save_safetensors(str(folder / name), weights, metadata={"format": "mlx"})
            weights.clear()
            shard, pending = shard + 1, 0

    for gname, tensor in g.tensors.items():
        if gname in plan.skipped:
            continue
        hf = plan.names.get(gname)
        if hf is None:
            raise UnsupportedGGUF(f"unexpected tensor {gname!r} for a {g.metadata.get('general.architecture')} GGUF")
        hf_mod, _, suffix = hf.rpartition(".")
        layout = served_layout(tensor.type, kernel)
        if layout.bits is not None and suffix != "weight":
            raise UnsupportedGGUF(f"quantized bias tensor {gname!r}")
        parts = mlx_tensor(gname, tensor.type, g.raw(gname), tensor.shape, target, layout)
        if suffix == "weight" and len(tensor.shape) > 1:
            module_bits[hf_mod] = layout.bits
        kind = gname.split(".")[-2]
        for part, arr in parts.items():
            if plan.permute_qk and kind in ("attn_q", "attn_k"):
                arr = unpermute_rows(arr, heads if kind == "attn_q" else kv_heads)
            if plan.norm_plus_one and kind.endswith("norm"):
                arr = arr - 1
            weights[hf if part == "weight" else f"{hf_mod}.{part}"] = arr
            pending += arr.nbytes
        if pending >= SHARD_BYTES:
            flush()
    flush()
    return module_bits


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike,
                 *, overwrite: bool = False, dtype: str = "auto",
                 kernel: tuple[int, ...] | bool | None = None) -> Path:
    """Convert a GGUF file into an HF-format folder loadable by ``mlx_lm.load``.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: folder to create.  It is written as a temporary sibling folder and
            renamed into place at the end, so a failed or interrupted conversion never
            leaves a half-written ``out_dir``.
        overwrite: replace ``out_dir`` if it exists (otherwise ``FileExistsError``).
        dtype: dtype of every floating-point tensor written (norms, F16/F32 matrices
            and the scales/biases of quantized ones): ``"auto"`` (float32 for an
            all-F32 file; otherwise :func:`auto_float_dtype`, i.e. float16 on a GPU and
            float32 on a CPU-only MLX), ``"float16"``, ``"bfloat16"`` (lossy for the
            f16 scales), ``"float32"``, or ``"keep"`` (F32 norms, F16 stay F16, scales
            float32).
        kernel: the widths the mlxrt-qmv CPU kernel computes fast, the others widened to 8
            bits (:func:`~mlxrt.loading.gguf_quant.served_layout`); ``True``:
            :data:`~mlxrt.loading.gguf_quant.KERNEL_BITS` (any kernel's), ``False``: no
            kernel (every layout as it is); default
            :func:`~mlxrt.loading.gguf_quant.kernel_widths` (this process's kernel).

    Returns:
        ``Path(out_dir)``.

    Raises:
        UnsupportedGGUF: an architecture, tensor type, tokenizer or RoPE variant this
            converter cannot express (the message names it).
    """
    import mlx.core as mx

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists (pass overwrite=True to replace it)")
    stat = gguf_path.stat()

    g = read_gguf(gguf_path)
    md = g.metadata
    type_counts = Counter(g.type_name(n) for n in g.tensors)
    for name, t in g.tensors.items():
        layout_of(name, t.type)  # refuse an unknown type before any work
    plan = plan_architecture(g)
    config = dict(plan.config)
    if not md.get("tokenizer.ggml.tokens"):
        raise UnsupportedGGUF("GGUF has no tokenizer (tokenizer.ggml.tokens)")
    tokenizer = build_tokenizer(md)  # fail early, before converting the weights

    if kernel is None:
        kernel = kernel_widths()
    elif isinstance(kernel, bool):
        kernel = KERNEL_BITS if kernel else None
    all_f32 = set(type_counts) <= {"F32"}
    dtype_name = ("float32" if all_f32 else auto_float_dtype()) if dtype == "auto" else dtype
    try:
        target = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32,
                  "keep": None}[dtype_name]
    except KeyError:
        raise ValueError(f"dtype must be auto/keep/float16/bfloat16/float32, not {dtype!r}") from None

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        module_bits = _write_weights(g, plan, target, tmp, kernel)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    # mlx-lm quantization block: most common bits as the default, overrides elsewhere
    qbits = [b for b in module_bits.values() if b]
    if qbits:
        default_bits = Counter(qbits).most_common(1)[0][0]
        quant: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default_bits, "mode": "affine"}
        for mod in sorted(module_bits):
            b = module_bits[mod]
            if b is None:
                quant[mod] = False
            elif b != default_bits:
                quant[mod] = {"group_size": GROUP_SIZE, "bits": b, "mode": "affine"}
        config["quantization"] = quant
        config["quantization_config"] = dict(quant)

    bos_id = md.get("tokenizer.ggml.bos_token_id")
    eos_id = md.get("tokenizer.ggml.eos_token_id")
    eot_id = md.get("tokenizer.ggml.eot_token_id")
    if bos_id is not None:
        config["bos_token_id"] = int(bos_id)
    if eos_id is not None:
        config["eos_token_id"] = int(eos_id)
    # transformers' config classes default some (Phi-3: 32000); the tokenizer's own, or none
    pad = md.get("tokenizer.ggml.padding_token_id")
    config["pad_token_id"] = int(pad) if pad is not None else None
    config["torch_dtype"] = "float16" if dtype_name == "keep" else dtype_name
    gen: dict[str, Any] = {"do_sample": False}
    if bos_id is not None:
        gen["bos_token_id"] = int(bos_id)
    tokens = md["tokenizer.ggml.tokens"]
    types = list(md.get("tokenizer.ggml.token_type") or [])
    ends = [i for i, t in enumerate(tokens) if t in _END_OF_GENERATION and i < len(types) and types[i] == 3]
    eos_ids = [int(i) for i in (eos_id, eot_id, *ends) if i is not None]
    eos_ids = list(dict.fromkeys(eos_ids))
    if eos_ids:
        gen["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    pad_id = md.get("tokenizer.ggml.padding_token_id")
    if pad_id is not None:
        gen["pad_token_id"] = int(pad_id)

    marker = {
        "converter": "mlxrt.loading.gguf",
        "converter_version": CONVERTER_VERSION,
        "source": str(gguf_path.resolve()),
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
        "dtype": dtype_name,
        "gguf_version": g.version,
        "name": md.get("general.name"),
        "architecture": md.get("general.architecture"),
        "tensor_types": dict(sorted(type_counts.items())),
        "kernel_widths": list(kernel) if kernel is not None else None,
        "layouts": {t: attrs.asdict(served_layout(t, kernel)) for t in sorted(type_counts)},
    }

    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the result is an ordinary folder
        _write_json(tmp / "config.json", dict(sorted(config.items())))
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json",
                    tokenizer_config(md, config.get("max_position_embeddings")))
        _write_json(tmp / "generation_config.json", gen)
        _write_json(tmp / MARKER_FILE, marker)
        if out_dir.exists() or out_dir.is_symlink():
            trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, trash / "old")
            os.replace(tmp, out_dir)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
