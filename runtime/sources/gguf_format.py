"""The GGUF file format: tensor type names, the header reader, and the converter's error.

Only the header is parsed here (metadata and the tensor directory); tensor data is left to
``mx.load``, which decodes the supported block formats itself.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

__all__ = ["GGML_TYPE_NAMES", "SUPPORTED_TENSOR_TYPES", "UnsupportedGGUF", "GGUFHeader",
           "read_gguf_header", "metadata_value"]

#: ggml tensor type ids (ggml.h ``enum ggml_type``).
GGML_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
    9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
    15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
    26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}

#: GGUF tensor types this converter accepts, with the mlx bits for quantized ones
#: (``None`` = stored as a plain float array).
SUPPORTED_TENSOR_TYPES: dict[str, int | None] = {
    "F32": None, "F16": None, "Q4_0": 4, "Q4_1": 4, "Q8_0": 8,
}

class UnsupportedGGUF(ValueError):
    """The GGUF file uses an architecture, tensor type or tokenizer we cannot convert."""


# --------------------------------------------------------------------------------------
# GGUF header reader (metadata + tensor directory; tensor data is left to mx.load)
# --------------------------------------------------------------------------------------

class GGUFHeader:
    """Parsed GGUF header: ``version``, ``metadata`` (key -> python value) and
    ``tensors`` (name -> ``(ggml_type_id, shape)``, shape in row-major/mlx order)."""

    def __init__(self, version: int, metadata: dict[str, Any],
                 tensors: dict[str, tuple[int, tuple[int, ...]]]):
        self.version = version
        self.metadata = metadata
        self.tensors = tensors

    def type_name(self, tensor: str) -> str:
        t = self.tensors[tensor][0]
        return GGML_TYPE_NAMES.get(t, f"type#{t}")

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"GGUFHeader(version={self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")


_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                   7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Read the metadata and tensor directory of a GGUF (v2/v3) file.

    Raises :class:`UnsupportedGGUF` for files that are not GGUF or use GGUF v1.
    """
    import numpy as np

    path = Path(path)
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # empty file
            raise UnsupportedGGUF(f"{path}: not a GGUF file ({e})") from None
    try:
        if mm[:4] != b"GGUF":
            raise UnsupportedGGUF(f"{path}: not a GGUF file (bad magic {mm[:4]!r})")
        (version,) = struct.unpack_from("<I", mm, 4)
        if version not in (2, 3):
            raise UnsupportedGGUF(f"{path}: GGUF version {version} is not supported "
                                  "(only v2 and v3)")
        n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
        off = 24

        def read_str(o: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", mm, o)
            o += 8
            return mm[o:o + n].decode("utf-8", errors="replace"), o + n

        def read_value(t: int, o: int) -> tuple[Any, int]:
            if t in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[t]
                (v,) = struct.unpack_from(fmt, mm, o)
                return v, o + struct.calcsize(fmt)
            if t == 8:
                return read_str(o)
            if t == 9:
                et, n = struct.unpack_from("<IQ", mm, o)
                o += 12
                if et in _NUMPY_DTYPES:
                    dt = np.dtype(_NUMPY_DTYPES[et])
                    arr = np.frombuffer(mm, dtype=dt, count=n, offset=o)
                    vals = arr.astype(bool).tolist() if et == 7 else arr.tolist()
                    return vals, o + n * dt.itemsize
                out = []
                for _ in range(n):
                    v, o = read_value(et, o)
                    out.append(v)
                return out, o
            raise UnsupportedGGUF(f"{path}: unknown GGUF metadata value type {t}")

        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, off = read_str(off)
            (t,) = struct.unpack_from("<I", mm, off)
            metadata[key], off = read_value(t, off + 4)

        tensors: dict[str, tuple[int, tuple[int, ...]]] = {}
        for _ in range(n_tensors):
            name, off = read_str(off)
            (nd,) = struct.unpack_from("<I", mm, off)
            dims = struct.unpack_from(f"<{nd}Q", mm, off + 4)
            off += 4 + 8 * nd
            t, _data_off = struct.unpack_from("<IQ", mm, off)
            off += 12
            tensors[name] = (t, tuple(reversed(dims)))  # ggml ne[0] is the innermost dim
    except struct.error as e:
        raise UnsupportedGGUF(f"{path}: truncated or corrupt GGUF header ({e})") from None
    finally:
        mm.close()
    return GGUFHeader(version, metadata, tensors)


def metadata_value(md: dict[str, Any], key: str, default: Any = None) -> Any:
    v = md.get(key, default)
    return default if v is None else v
