"""Files of a tiny checkpoint: random tensors, safetensors, JSON, the generated tokenizer.

Shared by :mod:`mlxrt.testing` and its per-family writers (``_tiny_*``), so that those import
one helper module instead of :mod:`mlxrt.testing`'s private names.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from mlxrt.testing._tokenizer_factory import generated_tokenizer

__all__ = ["DTYPES", "Weights", "merge", "bf16_bits", "save_safetensors", "write_json",
           "write_generated_tokenizer"]

#: Serving dtype name -> safetensors dtype.
DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


class Weights(dict):
    """Named float32 tensors drawn from one generator, in call order."""

    def __init__(self, rng: np.random.Generator):
        super().__init__()
        self.rng = rng

    def normal(self, name: str, shape, std: float, mean: float = 0.0) -> None:
        self[name] = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)

    def linear(self, name: str, out_f: int, in_f: int) -> None:
        self.normal(name, (out_f, in_f), in_f**-0.5)

    def norm(self, name: str, d: int, center: float = 1.0) -> None:
        """RMSNorm scale: center 1 for x*w norms, 0 for x*(1+w) norms."""
        self.normal(name, (d,), 0.1, center)


def merge(base: dict, over: Mapping) -> dict:
    for k, v in over.items():
        base[k] = merge(dict(base[k]), v) if isinstance(v, Mapping) and isinstance(base.get(k), dict) else v
    return base


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def save_safetensors(path: Path, tensors: Mapping[str, np.ndarray], dtype: str) -> None:
    """Write a safetensors file: u64 header length, JSON header, raw little-endian data."""
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        a = tensors[name]
        if dtype == "bfloat16":
            raw = bf16_bits(a).tobytes()
        else:
            raw = np.ascontiguousarray(a, dtype="<f2" if dtype == "float16" else "<f4").tobytes()
        header[name] = {"dtype": DTYPES[dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_generated_tokenizer(out: Path, family: str) -> tuple[int, dict, dict]:
    g = generated_tokenizer(family)
    for stale in ("chat_template.jinja", "added_tokens.json"):  # left by an earlier tokenizer_dir write
        (out / stale).unlink(missing_ok=True)
    (out / "tokenizer.json").write_text(g.tokenizer_json, encoding="utf-8")
    (out / "tokenizer_config.json").write_text(g.tokenizer_config, encoding="utf-8")
    (out / "special_tokens_map.json").write_text(g.special_tokens_map, encoding="utf-8")
    return g.num_tokens, dict(g.ids), json.loads(g.tokenizer_config)
