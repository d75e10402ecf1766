"""A model folder checked before it serves (and, in the model pool, before anything is evicted
for it): a folder that would load and then fail every request, or read memory out of bounds,
is a clear load error instead.

Read from config.json, tokenizer.json and the safetensors files alone (headers, and a few
small slices of tensor data), nothing built:

- **weights present**: at least one ``*.safetensors`` file (a folder with a config and no
  weights was loaded after the pool evicted the model that served);
- **weight dtypes the architecture can use**: every ``*.weight`` tensor is a float (F16, BF16,
  F32, F64, FP8), or, in a quantized checkpoint (``quantization`` in config.json), a packed
  integer (U32, U8); an integer weight (int32 weights loaded, then every request was a 500)
  is refused;
- **finite numbers**, a sample: every norm weight (``*norm*.weight``: one vector per layer,
  small) whole, and the first :data:`SAMPLE_VALUES` values of each quantization scale and bias
  (``*.scales``, ``*.biases``) and of the token embedding; a NaN or an infinity there is refused
  (such a model answered garbage silently);
- **vocabulary** (:func:`check_vocabulary`, once the tokenizer is loaded: parsing a large
  tokenizer.json again costs seconds): the config's ``vocab_size`` and the embedding's rows
  cover the tokenizer's largest id (a smaller one was served and read the embedding out of
  bounds).

Measured: 1–2 ms for a tiny checkpoint, a few ms for the embedded SmolLM2 (headers and the
sampled slices).
"""

from __future__ import annotations

import array
import json
import math
import re
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxrt.errors import ModelLoadError

__all__ = ["check_model_folder", "check_vocabulary", "SAMPLE_VALUES"]

#: Values read from each sampled tensor (scales, biases, the embedding).
SAMPLE_VALUES = 4096
_FLOATS = {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"}
_PACKED = {"U32", "U8"}
_NORM = re.compile(r"norm[^.]*\.weight$")
_EMBEDDING = re.compile(r"(?:^|\.)embed_tokens\.weight$|(?:^|\.)wte\.weight$|(?:^|\.)tok_embeddings\.weight$")
_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_MAX_HEADER = 100 * 2**20


def check_model_folder(path: Path) -> None:
    """Raise :class:`ModelLoadError` (code ``model_folder_invalid``) naming what is wrong with
    the model folder ``path``; nothing for a folder that passes, or whose files this cannot
    read (the loader reports those)."""
    problem = _problem(Path(path))
    if problem is not None:
        raise ModelLoadError(f"{path}: {problem}", code="model_folder_invalid")


def _problem(path: Path) -> str | None:
    config = _json(path / "config.json")
    if not isinstance(config, dict):
        return None  # no readable config: the loader says so
    files = sorted(f for f in path.glob("*.safetensors") if f.is_file())
    if not files:
        return "no weights: the folder has config.json but no *.safetensors file"
    quantized = isinstance(config.get("quantization"), dict) or isinstance(config.get("quantization_config"), dict)
    for file in files:
        header = _header(file)
        if header is None:
            return None  # unreadable: the loader's error
        data_start, tensors = header
        for name, entry in tensors.items():
            dtype = str(entry.get("dtype"))
            if name.endswith(".weight") and dtype not in _FLOATS and not (quantized and dtype in _PACKED):
                return (f"tensor {name} is {dtype}: weights must be floating point (F16, BF16, F32)"
                        + ("" if quantized else ", or packed integers in a quantized checkpoint"))
            whole = _NORM.search(name) is not None
            if whole or name.endswith((".scales", ".biases")) or _EMBEDDING.search(name):
                if dtype in _BYTES and not _finite(file, data_start, entry, dtype, whole=whole):
                    return f"tensor {name} holds NaN or infinite values"
    return None


def check_vocabulary(path: Path, tokenizer: Any) -> None:
    """Raise :class:`ModelLoadError` when the model in ``path`` has fewer token rows (config.json's
    ``vocab_size``, the embedding's rows) than the loaded ``tokenizer`` has ids."""
    problem = _vocabulary_problem(Path(path), tokenizer)
    if problem is not None:
        raise ModelLoadError(f"{path}: {problem}", code="model_folder_invalid")


def _vocabulary_problem(path: Path, tokenizer: Any) -> str | None:
    config = _json(path / "config.json")
    size = _tokenizer_size(tokenizer)
    if not isinstance(config, dict) or size is None:
        return None
    largest = size - 1
    text = config.get("text_config")
    vocab = (text if isinstance(text, dict) else {}).get("vocab_size", config.get("vocab_size"))
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab <= largest:
        return (f"config.json's vocab_size is {vocab} but the tokenizer has ids up to {largest}: "
                "the embedding would be read out of bounds")
    rows = _embedding_rows(path)
    if rows is not None and rows <= largest:
        return f"the embedding has {rows} rows but the tokenizer has ids up to {largest}"
    return None


def _tokenizer_size(tokenizer: Any) -> int | None:
    """Ids the tokenizer has, added tokens included (mlxrt's tokenizer and transformers' answer
    ``len``; mlx-lm's wrapper holds transformers' as ``_tokenizer``)."""
    for candidate in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        try:
            return int(len(candidate))
        except TypeError:
            continue
    return None


def _embedding_rows(path: Path) -> int | None:
    for file in sorted(path.glob("*.safetensors")):
        header = _header(file)
        for name, entry in (header[1] if header is not None else {}).items():
            shape = entry.get("shape") or []
            if _EMBEDDING.search(name) and shape:
                return int(shape[0])
    return None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _header(file: Path) -> tuple[int, dict[str, dict[str, Any]]] | None:
    """Where a safetensors file's data starts, and its header's tensor entries (``None``: not
    a readable safetensors file)."""
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            size = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < size <= _MAX_HEADER:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    return 8 + size, {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def _finite(file: Path, data_start: int, entry: Mapping[str, Any], dtype: str, *, whole: bool) -> bool:
    begin, end = entry.get("data_offsets", (0, 0))
    width = _BYTES[dtype]
    count = (end - begin) // width if whole else min((end - begin) // width, SAMPLE_VALUES)
    if count <= 0:
        return True
    with open(file, "rb") as f:
        f.seek(data_start + begin)
        raw = f.read(count * width)
    return _all_finite(raw, dtype)


def _all_finite(raw: bytes, dtype: str) -> bool:
    """Whether the little-endian ``dtype`` values in ``raw`` are all finite. No numpy: a served
    request imports nothing heavy (tests/test_lean_start.py). The sum of finite values is
    finite in double precision (at most a few million values of at most 3.4e38 here), and one
    NaN or infinity makes it NaN or infinite."""
    if dtype == "F16":
        values: Any = struct.unpack(f"<{len(raw) // 2}e", raw)
    elif dtype == "BF16":  # a bfloat16 is the high half of a float32
        widened = bytearray(2 * len(raw))
        widened[2::4], widened[3::4] = raw[0::2], raw[1::2]
        values = _little_endian(array.array("f", widened))
    else:
        values = _little_endian(array.array("f" if dtype == "F32" else "d", raw))
    return math.isfinite(sum(values)) if values else True


def _little_endian(values: array.array) -> array.array:
    if sys.byteorder == "big":
        values.byteswap()
    return values
