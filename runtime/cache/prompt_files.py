"""Files of the prompt cache on disk (:mod:`mlxrt.cache.prompt_store`): model fingerprints and
KV entries as safetensors in mlx-lm's prompt-cache layout, written atomically.

mlx-lm's ``save_prompt_cache`` needs MLX arrays on the calling thread; these helpers split the
work so that only :func:`host_copy` (a copy to plain bytes) runs on the engine's worker and
:func:`write_safetensors` runs on a writer thread. ``load_prompt_cache`` reads the files back.
Byte order is the machine's, little-endian on every platform MLX runs on.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from array import array
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "DTYPES", "fingerprint_folder", "model_fingerprint", "compact_state", "signature",
           "HostArray", "host_copy", "scalar_copy", "write_safetensors", "read_metadata", "private_folder", "PRIVATE_FILE"]

#: Bumped when the file layout changes: files of another format are another fingerprint.
FORMAT = 1
_SAMPLE = 1 << 20
#: Entries hold token ids that decode to whole prompts: only the server's user may read them.
PRIVATE_FILE = 0o600
_PRIVATE_FOLDER = 0o700
_WEIGHTS = (".safetensors", ".npz", ".gguf", ".bin")
#: An array copied off MLX for the writer: (safetensors dtype tag, shape, raw bytes).
HostArray = tuple[str, tuple[int, ...], bytes]
#: MLX dtype names → safetensors dtype tags.
DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32",
          "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "int64": "I64", "uint64": "U64"}


def fingerprint_folder(folder: str | os.PathLike) -> str:
    """A content identity of a model or adapter folder, cheap for multi-GB weights: every JSON
    file whole, every weight file by name, size and three 1 MiB samples (start, middle, end)."""
    digest = hashlib.sha256()
    root = Path(folder)
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        if path.suffix == ".json":
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        elif path.suffix in _WEIGHTS:
            size = path.stat().st_size
            digest.update(f"{path.name}\0{size}".encode())
            with path.open("rb") as f:
                for at in sorted({0, max(size // 2 - _SAMPLE // 2, 0), max(size - _SAMPLE, 0)}):
                    f.seek(at)
                    digest.update(f.read(_SAMPLE))
    return digest.hexdigest()


def model_fingerprint(model_path: str | os.PathLike, *, dtype: str | None = None, kv: Any = None,
                      draft_path: str | os.PathLike | None = None) -> str:
    """The prompt-store folder name for a served configuration (see the module docstring)."""
    parts = {"format": FORMAT, "model": fingerprint_folder(model_path), "dtype": dtype, "kv": kv,
             "draft": fingerprint_folder(draft_path) if draft_path is not None else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]

def compact_state(layer: Any) -> Any:
    """A layer's state for the file: a plain KV cache's buffers cut to the tokens it holds
    (mlx-lm keeps up to 255 unused slots; ``from_state`` grows them back on the next token)."""
    state = layer.state
    if type(layer).__name__ == "KVCache" and isinstance(state, tuple) and len(state) == 3 \
            and isinstance(state[2], int) and state[0] is not None:
        keys, values, offset = state
        return keys[..., :offset, :], values[..., :offset, :], offset
    return state


def signature(layer: Any) -> list[tuple[str, tuple[int, ...]]]:
    """Each state array's dtype and shape, the token axis (-2) left out."""
    from mlx.utils import tree_flatten

    out = []
    for _, value in tree_flatten(layer.state):
        if not hasattr(value, "shape"):
            continue
        shape = tuple(value.shape)
        out.append((str(value.dtype), shape[:-2] + shape[-1:] if len(shape) >= 3 else shape))
    return out


def host_copy(value: Any) -> HostArray:
    """An mlx array as a :data:`HostArray`; bfloat16 travels as its raw 16 bits."""
    import mlx.core as mx

    dtype = str(value.dtype).removeprefix("mlx.core.")
    if dtype == "bfloat16":
        value = value.view(mx.uint16)
    view = memoryview(value)  # C-order copy below, also of a sliced (non-contiguous) array
    return ("BF16" if dtype == "bfloat16" else DTYPES[dtype]), tuple(view.shape), view.tobytes()


def scalar_copy(value: int | float | None) -> HostArray:
    """A plain number of a cache's state as a 0-d array (``None``: an empty float32 one), as
    mlx-lm writes them."""
    if value is None:
        return "F32", (0,), b""
    if isinstance(value, int):
        return "I32", (), array("i", [value]).tobytes()
    return "F32", (), array("f", [value]).tobytes()


def write_safetensors(path: Path, arrays: dict[str, HostArray], metadata: dict[str, str]) -> int:
    """Write a safetensors file atomically (temporary file, fsync, rename); its size."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, (dtype, shape, data) in arrays.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        os.fchmod(fd, PRIVATE_FILE)  # a leftover temporary file keeps its old mode through O_CREAT
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for _dtype, _shape, data in arrays.values():
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise
    return 8 + len(raw) + offset


def read_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (only the header is read)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", head)
        if n > min(path.stat().st_size - 8, 100 << 20):
            raise ValueError("not a safetensors file (bad header length)")
        header = json.loads(f.read(n))
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise ValueError("no mlxrt prompt-cache metadata")
    return meta


def private_folder(root: str | os.PathLike, name: str) -> Path:
    """``root/name``, made 0700: ``name`` is ours and is tightened even when it exists; the
    folders up to ``root`` are created 0700 where missing, an existing one is the user's and
    left as it is."""
    root = Path(root).expanduser()
    missing = [p for p in (root, *root.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=_PRIVATE_FOLDER, exist_ok=True)
    folder = root / name
    folder.mkdir(mode=_PRIVATE_FOLDER, exist_ok=True)
    os.chmod(folder, _PRIVATE_FOLDER)
    return folder
