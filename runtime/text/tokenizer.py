"""The model's tokenizer, built on the ``tokenizers`` library and Jinja alone.

mlx-lm's ``TokenizerWrapper`` wraps a ``transformers`` tokenizer, and importing transformers
costs start-up time and memory (docs/performance.md). :class:`TextTokenizer` offers the part
of that wrapper mlxrt uses — ``encode``, ``decode``, ``apply_chat_template``, a settable
``chat_template``, ``eos_token_id(s)``, ``vocab_size``, ``get_vocab``,
``added_tokens_decoder`` — with the same results (tests/test_tokenizer_parity.py).

:func:`load_tokenizer` picks it when the folder has a ``tokenizer.json`` of a tokenizer class
whose loading mlxrt reproduces (:data:`NATIVE_CLASSES`), and falls back to mlx-lm's loader
(which imports transformers) otherwise; :func:`fallback_reason` says why. Structured outputs
need a transformers tokenizer for llguidance: :meth:`TextTokenizer.transformers_tokenizer`
builds one on first use.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxrt.compat import mlx_lm_sets_tokenizer_defaults
from mlxrt.text.chat_template import ChatTemplates, pick_template, render_chat_template
from mlxrt.text.token_bytes import CLEAN_UP

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["NATIVE_CLASSES", "TextTokenizer", "fallback_reason", "load_tokenizer"]

log = logging.getLogger("mlxrt.tokenizer")

#: ``tokenizer_class`` values (tokenizer_config.json) served without transformers, with the
#: special tokens their transformers class defaults to when the config does not name them.
#: transformers 5 rebuilds these classes' pipelines from the class; for these the rebuilt one
#: encodes as ``tokenizer.json`` does (the parity tests check the real Qwen3, Qwen3.5, Gemma 3
#: and SmolLM2 tokenizers). Any other class loads through mlx-lm.
NATIVE_CLASSES: Mapping[str, Mapping[str, str | None]] = {
    "PreTrainedTokenizerFast": {},
    "TokenizersBackend": {},
    "Qwen2Tokenizer": {"unk_token": "<|endoftext|>", "bos_token": None, "eos_token": "<|endoftext|>",
                       "pad_token": "<|endoftext|>"},
    "Qwen3_5Tokenizer": {"unk_token": "<|endoftext|>", "bos_token": None, "eos_token": "<|endoftext|>",
                         "pad_token": "<|endoftext|>"},
    "GemmaTokenizer": {"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                       "mask_token": "<mask>"},
    "GPT2Tokenizer": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                      "pad_token": None},
}

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named special tokens every tokenizer has.
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_config.json keys that mean code or behaviour this module does not reproduce: when
# present, and when set to a true value.
_UNSUPPORTED_KEYS = ("auto_map", "chat_template_type", "tool_parser_type", "fast_tokenizer_files")
_UNSUPPORTED_IF_TRUE = ("split_special_tokens", "fix_mistral_regex")
# mlx-lm's wrapper fills ``enable_thinking`` with whether the vocabulary has thinking markers.
_THINK_PAIRS = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"),
                ("<|think:start|>", "<|think:end|>"), ("<|channel>", "<channel|>"))
_XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def _content(token: Any) -> Any:
    return token.get("content") if isinstance(token, dict) else token


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def _chat_templates(path: Path, config: Mapping[str, Any]) -> ChatTemplates | None:
    """The templates transformers loads: ``chat_template.jinja`` and
    ``additional_chat_templates/*.jinja`` replace tokenizer_config.json's ``chat_template``."""
    found: dict[str, str] = {}
    if (path / "chat_template.jinja").is_file():
        found["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            found[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    if found:
        return found["default"] if list(found) == ["default"] else found
    template = config.get("chat_template")
    if isinstance(template, (list, tuple)):
        return {t["name"]: t["template"] for t in template}
    return template if isinstance(template, str) else None


def _special_tokens(path: Path, config: Mapping[str, Any], defaults: Mapping[str, str | None]
                    ) -> tuple[dict[str, str], list[str]]:
    """(transformers' ``special_tokens_map``: the named and model-specific special tokens,
    every special token string) as transformers derives them from the folder."""
    init = dict(config)
    if "added_tokens_decoder" not in init:  # legacy special_tokens_map.json, merged over the config
        for key, value in _read_json(path / "special_tokens_map.json").items():
            if key == "extra_special_tokens" and isinstance(value, list):
                have = list(init.get("extra_special_tokens") or [])
                value = have + [t for t in value if t not in have]
            init[key] = value
    if "additional_special_tokens" in init and not init.get("extra_special_tokens"):
        init["extra_special_tokens"] = init.pop("additional_special_tokens")
    named = {k: _content(init[k]) if k in init else defaults.get(k) for k in _NAMED}
    specific = {k: v for k, v in init.items() if k not in _NAMED and k.endswith("_token") and isinstance(v, str)}
    extra = init.get("extra_special_tokens")
    if isinstance(extra, dict):
        specific.update({k: _content(v) for k, v in extra.items()})
        extra = []
    mapping = {k: str(v) for k, v in named.items() if v is not None}
    mapping.update({k: str(v) for k, v in specific.items() if v is not None})
    every = list(dict.fromkeys([*mapping.values(), *(str(_content(t)) for t in (extra or []))]))
    return mapping, every


def fallback_reason(path: str | Path, *, trust_remote_code: bool = False) -> str | None:
    """Why the folder's tokenizer must load through mlx-lm (and so transformers), or ``None``
    when :class:`TextTokenizer` serves it."""
    path = Path(path)
    if trust_remote_code:
        return "--trust-remote-code lets the tokenizer's own code run"
    if not (path / "tokenizer.json").is_file():
        return "no tokenizer.json"
    config = _read_json(path / "tokenizer_config.json")
    cls = config.get("tokenizer_class")
    if cls not in NATIVE_CLASSES:
        return f"tokenizer_class {cls!r} is not one mlxrt reproduces"
    for key in _UNSUPPORTED_KEYS:
        if key in config:
            return f"tokenizer_config.json sets {key}"
    for key in _UNSUPPORTED_IF_TRUE:
        if config.get(key):
            return f"tokenizer_config.json sets {key}"
    for key, value in config.items():
        if key.endswith("_token") and isinstance(value, dict) and key not in _NAMED:
            return f"tokenizer_config.json's {key} is an AddedToken object"
    model_type = _read_json(path / "config.json").get("model_type")
    if isinstance(model_type, str) and mlx_lm_sets_tokenizer_defaults(model_type):
        return f"mlx-lm's {model_type} model sets tokenizer defaults"
    return None


class TextTokenizer:
    """A model's tokenizer: a ``tokenizers.Tokenizer`` plus what tokenizer_config.json says.

    The mlx-lm wrapper's surface mlxrt uses, with transformers' results; build it with
    :func:`load_tokenizer`.
    """

    def __init__(self, backend: Tokenizer, path: Path, *, config: Mapping[str, Any],
                 special_tokens_map: Mapping[str, str], chat_template: ChatTemplates | None,
                 eos_token_ids: Iterable[int] = ()) -> None:
        self._backend = backend
        self.path = path
        self.special_tokens_map = dict(special_tokens_map)
        self.chat_template = chat_template
        # transformers skips the clean-up for BPE models (it would eat real spaces) unless forced.
        forced = bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(backend.model).__name__ != "BPE" or forced)
        eos = self.special_tokens_map.get("eos_token")
        self.eos_token_id: int | None = backend.token_to_id(eos) if eos is not None else None
        self.eos_token_ids = set(eos_token_ids)
        if self.eos_token_id is not None:
            self.eos_token_ids.add(self.eos_token_id)
        self.has_thinking = any(backend.token_to_id(a) is not None and backend.token_to_id(b) is not None
                                for a, b in _THINK_PAIRS) or all(backend.token_to_id(t) is not None for t in _XTML)
        self._transformers: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # bos_token, eos_token, boi_token…: the special-token strings transformers exposes.
        if name.endswith("_token") and not name.startswith("_"):
            return self.__dict__.get("special_tokens_map", {}).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def backend_tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` underneath (transformers' fast tokenizers' name for it)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without added tokens (transformers' ``vocab_size``)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """Added-token id → ``tokenizers.AddedToken`` (its ``content``, ``special``…)."""
        return dict(sorted(self._backend.get_added_tokens_decoder().items()))

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self._backend.token_to_id(tokens)
        return [self._backend.token_to_id(t) for t in tokens]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self._backend.decode([ids] if isinstance(ids, int) else list(ids),
                                    skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            for a, b in CLEAN_UP:
                text = text.replace(a, b)
        return text

    def apply_chat_template(self, conversation: Sequence[Any], tools: Sequence[Any] | None = None,
                            documents: Sequence[Any] | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool | str = False,
                            tokenize: bool = True, sanitize_control_tokens: bool = False,
                            return_assistant_tokens_mask: bool = False, **kwargs: Any) -> str | list[int]:
        """``conversation`` through the chat template, as mlx-lm's wrapper over transformers
        renders it: ``enable_thinking`` defaults to whether the vocabulary has thinking
        markers; the special-token strings are template variables, ``kwargs`` override them;
        ``tokenize`` encodes the text without adding special tokens again."""
        for ignored in ("padding", "truncation", "max_length", "return_tensors", "return_dict",
                        "tokenizer_kwargs"):
            kwargs.pop(ignored, None)  # tokenizer options transformers accepts; a plain id list here
        if return_assistant_tokens_mask:
            raise ValueError("`return_assistant_tokens_mask=True` requires `return_dict=True` and `tokenize=True`")
        kwargs.setdefault("enable_thinking", self.has_thinking)
        source = pick_template(self.chat_template, chat_template, tools)
        if isinstance(conversation, (list, tuple)) and conversation and (
                isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages")):
            raise ValueError("mlxrt's tokenizer renders one conversation at a time")
        if sanitize_control_tokens and not tokenize:
            raise ValueError("`sanitize_control_tokens=True` requires `tokenize=True` and is not compatible with "
                             "`return_assistant_tokens_mask=True`.")
        if sanitize_control_tokens:
            raise NotImplementedError("sanitize_control_tokens is not supported by mlxrt's tokenizer")
        text = render_chat_template(source, conversation, tools=tools, documents=documents,
                                    add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message,
                                    variables={**self.special_tokens_map, **kwargs})
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def transformers_tokenizer(self) -> Any:
        """The same tokenizer as a ``transformers`` fast tokenizer, loaded from the folder on
        first use (structured outputs build their llguidance tokenizer from it); this is the
        only path that imports transformers."""
        with self._lock:
            if self._transformers is None:
                from transformers import AutoTokenizer

                self._transformers = AutoTokenizer.from_pretrained(self.path)
            return self._transformers


def _flags(token: Any) -> tuple[Any, ...]:
    if isinstance(token, dict):
        return tuple(token.get(k, d) for k, d in (("content", None), ("single_word", False), ("lstrip", False),
                                                   ("rstrip", False), ("normalized", True)))
    return token.content, token.single_word, token.lstrip, token.rstrip, token.normalized


def _native(path: Path, eos_token_ids: Iterable[int]) -> TextTokenizer | str:
    """The folder's :class:`TextTokenizer`, or why transformers would load it differently."""
    from tokenizers import AddedToken, Tokenizer

    config = _read_json(path / "tokenizer_config.json")
    mapping, special = _special_tokens(path, config, NATIVE_CLASSES[config["tokenizer_class"]])
    try:
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as exc:  # the library raises a bare Exception for a file it cannot parse
        raise ValueError(f"cannot read {path / 'tokenizer.json'}: {exc}") from exc
    # transformers encodes without truncation or padding unless a call asks for them.
    backend.no_truncation()
    backend.no_padding()
    decoder = backend.get_added_tokens_decoder()
    for index, token in (config.get("added_tokens_decoder") or {}).items():
        # transformers re-adds a config token that differs from tokenizer.json's, with the config's flags
        if not isinstance(token, dict) or str(index) not in map(str, decoder) or (
                _flags(token) != _flags(decoder[int(index)])):
            return f"tokenizer_config.json's added token {index} differs from tokenizer.json's"
    added = {t.content: t for t in decoder.values()}
    promote = []
    for text in special:
        token = added.get(text)
        if token is None:
            return f"special token {text!r} is not an added token of tokenizer.json (transformers would add it)"
        if not token.special:  # transformers marks every named special token special
            promote.append(AddedToken(text, single_word=token.single_word, lstrip=token.lstrip,
                                      rstrip=token.rstrip, normalized=token.normalized, special=True))
    if promote:
        backend.add_special_tokens(promote)
    return TextTokenizer(backend, path, config=config, special_tokens_map=mapping,
                         chat_template=_chat_templates(path, config), eos_token_ids=eos_token_ids)


def load_tokenizer(path: str | Path, *, eos_token_ids: int | Sequence[int] | None = None,
                   trust_remote_code: bool = False) -> Any:
    """The tokenizer of the model folder ``path``: a :class:`TextTokenizer` where possible,
    else mlx-lm's ``TokenizerWrapper`` (imports transformers; :func:`fallback_reason` says when).

    ``eos_token_ids``: config.json's ``eos_token_id`` (one id or a list); the tokenizer's own
    EOS is added to them, as mlx-lm does.
    """
    path = Path(path)
    eos = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids or [])
    reason = fallback_reason(path, trust_remote_code=trust_remote_code)
    loaded = _native(path, eos) if reason is None else reason
    if isinstance(loaded, TextTokenizer):
        return loaded
    log.info("tokenizer of %s loads through mlx-lm (imports transformers): %s", path.name, loaded)
    from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

    return mlx_lm_load_tokenizer(  # type: ignore[no-untyped-call]  # mlx-lm's is unannotated
        path, {"trust_remote_code": True} if trust_remote_code else None, eos_token_ids=eos_token_ids)
