"""``read_model_info``: a model folder's special tokens come from ``tokenizer.json``'s
``added_tokens``, read from the file's head rather than the whole file (the vocabulary and merges
after it are most of a 31 MB tokenizer), with the same answer as a whole parse wherever the list is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mlxrt.errors import ModelLoadError
from mlxrt.loading.resolve import ModelSource, read_model_info

SHARED = Path(os.environ.get("MLXRT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


def _folder(tmp_path: Path, tokenizer: str | bytes) -> ModelSource:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    data = tokenizer.encode() if isinstance(tokenizer, str) else tokenizer
    (tmp_path / "tokenizer.json").write_bytes(data)
    return ModelSource(tmp_path, "m", "folder")


def _added(n: int) -> list[dict]:
    # three-byte characters throughout, so the prefix reads cut characters in two
    return [{"id": 1000 + i, "content": f"<思考_{i}>", "special": True} for i in range(n)]


def _vocab(n: int) -> dict:
    return {"version": "1.0", "type": "BPE", "vocab": {f"词{i}": i for i in range(n)}, "merges": []}


@pytest.mark.parametrize("layout", ["added_tokens first", "after a long vocabulary", "no added_tokens"])
def test_special_tokens_are_those_a_whole_parse_reads(tmp_path, layout):
    added = _added(4000)  # ~200 KB: several prefix reads
    if layout == "added_tokens first":
        body = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "model": _vocab(50_000)}
    elif layout == "after a long vocabulary":
        body = {"version": "1.0", "model": _vocab(400_000), "added_tokens": added}  # > the 4 MiB head
    else:
        body = {"version": "1.0", "model": _vocab(10)}
    text = json.dumps(body, ensure_ascii=False, indent=2)
    info = read_model_info(_folder(tmp_path, text))
    expected = {t["content"]: t["id"] for t in json.loads(text).get("added_tokens", [])}
    assert info.special_tokens == expected
    assert len(info.special_tokens) == (0 if layout == "no added_tokens" else 4000)


@pytest.mark.parametrize("broken", [b'{"added_tokens": [{"id": 1, "content": "<a>"}', b'{"added_tokens": [}',
                                    b'{"added_tokens": [{"id": 1, "content": "\xff\xfe"}]}'])
def test_a_broken_tokenizer_json_is_refused_as_before(tmp_path, broken):
    with pytest.raises(ModelLoadError, match="cannot read .*tokenizer.json"):
        read_model_info(_folder(tmp_path, broken))


def test_a_folder_without_tokenizer_json_has_no_special_tokens(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert read_model_info(ModelSource(tmp_path, "m", "folder")).special_tokens == {}


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "qwen3_5"])
def test_real_tokenizers_special_tokens_are_unchanged(tmp_path, name):
    path = SHARED / "data" / "tokenizers" / name / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} is not here (../shared)")
    info = read_model_info(_folder(tmp_path, path.read_bytes()))
    whole = json.loads(path.read_text(encoding="utf-8"))["added_tokens"]
    assert info.special_tokens == {t["content"]: t["id"] for t in whole}
    assert len(info.special_tokens) > 10
