"""The GGUF file: its metadata, its tensor directory and each tensor's bytes.

The tensor types, their block sizes and their dequantization come from llama.cpp's own
``gguf`` package (``gguf.GGMLQuantizationType``, ``gguf.GGML_QUANT_SIZES``, ``gguf.quants``).
The header itself is parsed here: ``gguf.GGUFReader`` builds one numpy view per element of
every metadata array, which took 9.7 s on Gemma 3 270M's 262,144-token vocabulary (three
such arrays) against 0.34 s for this reader on the same file and machine; ``mlxrt ls`` and
``fit`` read the header of every GGUF on disk, so that cost would be paid on each listing.
Tensor data is mapped, never read whole: a tensor's bytes are a numpy view of the file.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import attrs

__all__ = ["UnsupportedGGUF", "GGUFTensor", "GGUFFile", "read_gguf", "metadata_value", "type_name"]


class UnsupportedGGUF(ValueError):
    """The GGUF file uses an architecture, tensor type or tokenizer we cannot convert."""


def type_name(type_id: int) -> str:
    """ggml's name of a tensor type id (``"Q4_K"``), or ``"type#N"`` for one gguf does not know."""
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type#{type_id}"


@attrs.frozen
class GGUFTensor:
    """One entry of the tensor directory; ``shape`` is row-major (ggml's ``ne`` reversed)."""

    name: str
    type_id: int
    shape: tuple[int, ...]
    offset: int  # from the start of the file

    @property
    def type(self) -> str:
        return type_name(self.type_id)

    @property
    def nbytes(self) -> int:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        n = 1
        for d in self.shape:
            n *= d
        return n // block * size


@attrs.frozen
class GGUFFile:
    """A parsed GGUF header: ``metadata`` (key -> python value) and ``tensors`` by name."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]

    def type_name(self, tensor: str) -> str:
        return self.tensors[tensor].type

    def raw(self, tensor: str) -> Any:
        """The tensor's bytes as a read-only numpy view of the file: float32/float16 arrays
        in its shape for F32/F16, else ``uint8`` rows of blocks (rows, bytes per row)."""
        import numpy as np

        t = self.tensors[tensor]
        if t.type in ("F32", "F16"):
            dtype = np.float32 if t.type == "F32" else np.float16
            count = int(np.prod(t.shape))
            return np.memmap(self.path, dtype=dtype, mode="r", offset=t.offset, shape=(count,)).reshape(t.shape)
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.offset,
                         shape=(t.nbytes,)).reshape(rows, t.nbytes // rows)


_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                   7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Read the metadata and tensor directory of a GGUF (v2/v3) file.

    Raises :class:`UnsupportedGGUF` for files that are not GGUF, use GGUF v1 or are cut short.
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
            raise UnsupportedGGUF(f"{path}: GGUF version {version} is not supported (only v2 and v3)")
        n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
        off = 24

        def read_str(o: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", mm, o)
            o += 8
            if o + n > len(mm):
                raise struct.error("string runs past the end of the file")
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
                    if o + n * dt.itemsize > len(mm):
                        raise struct.error("array runs past the end of the file")
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

        entries: list[tuple[str, int, tuple[int, ...], int]] = []
        for _ in range(n_tensors):
            name, off = read_str(off)
            (nd,) = struct.unpack_from("<I", mm, off)
            dims = struct.unpack_from(f"<{nd}Q", mm, off + 4)
            off += 4 + 8 * nd
            t, data_off = struct.unpack_from("<IQ", mm, off)
            off += 12
            entries.append((name, t, tuple(reversed(dims)), data_off))  # ggml ne[0] is innermost
        align = int(metadata.get("general.alignment") or 32)
        base = (off + align - 1) // align * align
        size = len(mm)
    except struct.error as e:
        raise UnsupportedGGUF(f"{path}: truncated or corrupt GGUF header ({e})") from None
    finally:
        mm.close()
    tensors = {name: GGUFTensor(name, t, shape, base + rel) for name, t, shape, rel in entries}
    for tensor in tensors.values():
        if tensor.type.startswith("type#"):
            continue  # named in the converter's refusal, not here: ls still lists the file
        if tensor.offset + tensor.nbytes > size:
            raise UnsupportedGGUF(f"{path}: tensor {tensor.name!r} runs past the end of the file (truncated?)")
    return GGUFFile(path, version, metadata, tensors)


def metadata_value(md: dict[str, Any], key: str, default: Any = None) -> Any:
    v = md.get(key, default)
    return default if v is None else v
