"""A tiny random-weight Duet checkpoint, in the Hugging Face layout, for tests and demos.

``write_tiny_duet(folder)`` writes what a real Duet repo would hold: ``config.json``,
``model.safetensors`` (parameter names as :mod:`mlxrt_family_duet.model` names them,
``model.layers.0.self_attn.q_proj.weight``...), ``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja`` and ``generation_config.json``. The weights are random (seeded: the
same seed gives the same files), so the model writes gibberish, but every path through mlxrt
-- loading, templating, prompt cache, batching, tool calls, reasoning -- is the real one.

The tokenizer is byte-level with no merges: token ``i`` is byte ``i`` for ``i < 256``, then the
added tokens of :data:`SPECIAL` (control tokens, stripped from decoded text) and
:data:`MARKUP` (tool and reasoning markup, kept in decoded text so mlxrt's parsers see it).

    python -m mlxrt_family_duet.checkpoint /tmp/duet && mlxrt serve /tmp/duet
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "SPECIAL", "MARKUP", "write_tiny_duet"]

#: Control tokens (special: decoding drops them). ``<|end|>`` ends a turn and is the EOS.
SPECIAL = ("<|endoftext|>", "<|turn|>", "<|end|>")
#: Markup the model writes and mlxrt reads back (not special: decoding keeps them).
MARKUP = ("<|think|>", "<|/think|>", "<|call|>", "<|/call|>", "<|result|>", "<|/result|>")

# Turns are "<|turn|>ROLE\n...<|end|>\n". The assistant's reasoning sits in <|think|>...<|/think|>
# before its text, each tool call is "<|call|>NAME {json}<|/call|>" after it, and a tool's
# answer is a "tool" turn in <|result|>...<|/result|>. With enable_thinking true the generation
# prompt opens <|think|> (the model reasons first); otherwise it pre-fills an empty span. mlxrt
# sets the switch from the client's reasoning_effort or chat_template_kwargs, or --thinking;
# when nothing says, mlx-lm's default: whether the vocabulary has a thinking pair it knows
# (<think>...), which Duet's is not -- so Duet answers without reasoning unless asked.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|turn|>system\\nYou can call these tools. To call one, write <|call|>NAME {JSON arguments}<|/call|>.' }}
{%- for tool in tools %}{{- '\\n' + ((tool.function if tool.function is defined else tool) | tojson) }}{%- endfor %}
{{- '<|end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'tool' %}
{{- '<|turn|>tool\\n<|result|>' + content + '<|/result|><|end|>\\n' }}
{%- else %}
{{- '<|turn|>' + message.role + '\\n' }}
{%- if message.role == 'assistant' and message.reasoning_content is string and message.reasoning_content %}
{{- '<|think|>' + message.reasoning_content + '<|/think|>' }}
{%- endif %}
{{- content }}
{%- for call in message.tool_calls or [] %}
{%- set f = call.function if call.function is defined else call %}
{{- '<|call|>' + f.name + ' ' + (f.arguments if f.arguments is string else (f.arguments | tojson)) + '<|/call|>' }}
{%- endfor %}
{{- '<|end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|turn|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking %}{{- '<|think|>' }}{%- else %}{{- '<|think|><|/think|>' }}{%- endif %}
{%- endif %}
"""

_SIZES = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16}


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table (``ByteLevel``'s): the character standing for byte ``i``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(_byte_alphabet())}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP])
    return tokenizer.to_str(pretty=True)


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    return {**base, **over}


def write_tiny_duet(path: str | Path, *, seed: int = 0, config_overrides: Mapping[str, Any] | None = None) -> Path:
    """Write a tiny random Duet checkpoint into ``path`` (created) and return it.

    :param seed: Seeds the weights (``numpy.random.default_rng``).
    :param config_overrides: Merged into config.json before the weights are drawn (sizes such
        as ``num_hidden_layers``).
    """
    import mlx.core as mx
    import numpy as np

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    ids = {token: 256 + i for i, token in enumerate(SPECIAL + MARKUP)}
    end, pad = ids["<|end|>"], ids["<|endoftext|>"]
    config = _merge({"architectures": ["DuetForCausalLM"], "model_type": "duet", **_SIZES,
                     "vocab_size": 256 + len(ids), "layer_norm_eps": 1e-5, "rope_theta": 10000.0,
                     "max_position_embeddings": 4096, "tie_word_embeddings": True, "torch_dtype": "float32",
                     "bos_token_id": None, "eos_token_id": end, "pad_token_id": pad}, config_overrides or {})

    rng = np.random.default_rng(seed)
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q_out = config["num_attention_heads"] * config["head_dim"]
    kv_out = config["num_key_value_heads"] * config["head_dim"]

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    # Small embeddings, so the layers (not each token's own row, through the tied output) pick
    # the next token; rows of bytes outside printable ASCII shrunk, so the random model writes
    # text rather than broken UTF-8.
    embed = normal((vocab, hidden), 0.1)
    embed[[b for b in range(256) if not (32 <= b < 127 or b == 10)]] *= 0.01
    weights = {"model.embed_tokens.weight": embed,
               "model.norm.weight": 1 + normal((hidden,), 0.1), "model.norm.bias": normal((hidden,), 0.1)}
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        weights[f"{layer}.input_layernorm.weight"] = 1 + normal((hidden,), 0.1)
        weights[f"{layer}.input_layernorm.bias"] = normal((hidden,), 0.1)
        for name, (rows, cols) in {"q_proj": (q_out, hidden), "k_proj": (kv_out, hidden),
                                   "v_proj": (kv_out, hidden), "o_proj": (hidden, q_out)}.items():
            weights[f"{layer}.self_attn.{name}.weight"] = normal((rows, cols), cols**-0.5)
        weights[f"{layer}.mlp.up_proj.weight"] = normal((inner, hidden), hidden**-0.5)
        weights[f"{layer}.mlp.down_proj.weight"] = normal((hidden, inner), inner**-0.5)
    mx.save_safetensors(str(out / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()},
                        metadata={"format": "pt"})

    def write(name: str, obj: Any) -> None:
        (out / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    write("config.json", config)
    write("generation_config.json", {"eos_token_id": [end, pad], "pad_token_id": pad})
    (out / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    write("tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": config["max_position_embeddings"],
        "added_tokens_decoder": {str(i): {"content": t, "special": t in SPECIAL, "normalized": False,
                                          "lstrip": False, "rstrip": False, "single_word": False}
                                 for t, i in ids.items()}})
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m mlxrt_family_duet.checkpoint FOLDER")
    print(write_tiny_duet(sys.argv[1]))
