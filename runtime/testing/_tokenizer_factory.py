"""Small generated tokenizers and chat templates for :mod:`mlxrt.testing`.

A byte-level BPE (a SentencePiece-style byte-fallback BPE for Gemma, as the real
Gemma tokenizers are) is trained with the `tokenizers` library on a small
embedded English corpus, and then laid out the way each family's real
`tokenizer.json` is: the family's control tokens are added tokens with the real
`special` flags (Qwen's `<think>`/`<tool_call>` are *not* special, so decoding
keeps them), at their real ids where the real ids are small (Gemma 4
`<|tool_call>`=48, `<|channel>`=100, `<|turn>`=105, `<turn|>`=106, `"\\n"`=107;
MiniCPM5 `<think>`=8), or right after the learned vocabulary where the real
vocabulary puts them after ~150k pieces (Qwen, MiniCPM5 `<|im_start|>`).

The normalizer / pre-tokenizer / decoder are the ones the family's
`transformers` tokenizer class rebuilds on load (transformers 5 rebuilds them
from the class, not from tokenizer.json), so `tokenizers` and `AutoTokenizer`
encode identically. Training is deterministic and cached per process.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

_MARK = "{# mlxrt test template #}"

# SmolLM2-Instruct's template (ChatML with a default system prompt).
CHATML_TEMPLATE = _MARK + (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

# Qwen3 (2504) template, condensed: JSON tool calls, reasoning re-rendered only
# after the last real user query, enable_thinking=false pre-fills an empty think.
QWEN3_TEMPLATE = _MARK + r"""{%- if tools %}
{{- '<|im_start|>system\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" and message.content is string and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}
{%- for message in messages %}{%- set content = message.content if message.content is string else '' %}
{%- if message.role == "user" or (message.role == "system" and not loop.first) %}{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- elif message.role == "assistant" %}{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}
{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}{{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}{{- '<|im_start|>assistant\n' + content }}{%- endif %}
{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\n</tool_call>' }}{%- endfor %}{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"""

# Qwen3.5: ChatML, Qwen3-Coder XML tool calls, thinking ON by default (the
# generation prompt opens <think>\n; enable_thinking=false pre-closes it).
QWEN35_TEMPLATE = _MARK + r"""{%- if tools %}
{{- '<|im_start|>system\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}
{%- for message in messages %}{%- set content = message.content if message.content is string else '' %}
{%- if message.role == "user" or (message.role == "system" and not loop.first) %}{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- elif message.role == "assistant" %}{{- '<|im_start|>assistant\n' }}
{%- if message.reasoning_content is string and loop.last %}{{- '<think>\n' + message.reasoning_content.strip('\n') + '\n</think>\n\n' }}{%- endif %}{{- content }}
{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}{%- if tool_call.arguments is mapping %}{%- for k, v in tool_call.arguments.items() %}{{- '<parameter=' + k + '>\n' }}{{- v if v is string else (v | tojson) }}{{- '\n</parameter>\n' }}{%- endfor %}{%- endif %}{{- '</function>\n</tool_call>' }}{%- endfor %}{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- else %}{{- '<think>\n' }}{%- endif %}{%- endif %}"""

# Gemma 4 surface syntax, condensed (not Google's byte-exact template):
# <bos><|turn>system\n[<|think|>\n]...<turn|>\n<|turn>user\n...<turn|>\n<|turn>model\n
GEMMA4_TEMPLATE = _MARK + r"""{%- macro gval(v) -%}
{%- if v is string -%}{{- '<|"|>' + v + '<|"|>' -}}
{%- elif v is boolean -%}{{- 'true' if v else 'false' -}}
{%- elif v is mapping -%}{{- '{' -}}{%- for k, x in v.items() -%}{{- k + ':' -}}{{- gval(x) -}}{%- if not loop.last -%},{%- endif -%}{%- endfor -%}{{- '}' -}}
{%- elif v is iterable -%}{{- '[' -}}{%- for x in v -%}{{- gval(x) -}}{%- if not loop.last -%},{%- endif -%}{%- endfor -%}{{- ']' -}}
{%- elif v is none -%}{{- 'null' -}}
{%- else -%}{{- v | string -}}{%- endif -%}
{%- endmacro -%}
{%- macro render_content(content) -%}
{%- if content is string -%}{{- content | trim -}}
{%- elif content is iterable -%}{%- for item in content -%}
{%- if item['type'] == 'text' -%}{{- item['text'] | trim -}}
{%- elif item['type'] == 'image' -%}{{- '\n\n<|image|>\n\n' -}}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set thinking = enable_thinking is defined and enable_thinking -%}
{%- if thinking or tools or (messages and messages[0]['role'] in ['system', 'developer']) -%}
{{- '<|turn>system\n' -}}
{%- if thinking -%}{{- '<|think|>\n' -}}{%- endif -%}
{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}{{- render_content(messages[0]['content']) -}}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}
{%- for tool in tools or [] -%}{%- set fn = tool['function'] if tool['function'] is defined else tool -%}
{{- '<|tool>declaration:' + fn['name'] + '{description:' + gval(fn['description'] | default('')) + ',parameters:' + gval(fn['parameters'] | default({})) + '}<tool|>' -}}
{%- endfor -%}
{{- '<turn|>\n' -}}
{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}
{%- for message in loop_messages -%}
{%- if message['role'] == 'tool' -%}
{{- '<|tool_response>response:' + (message['name'] | default('tool')) + '{value:' + gval(message['content'] if message['content'] is string else (message['content'] | tojson)) + '}<tool_response|>' -}}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<|turn>' + role + '\n' -}}
{%- if role == 'model' and message['reasoning_content'] is defined and message['reasoning_content'] and loop.last -%}{{- '<|channel>thought\n' + message['reasoning_content'] + '<channel|>' -}}{%- endif -%}
{{- render_content(message['content']) -}}
{%- for tc in message['tool_calls'] or [] -%}{%- set f = tc['function'] if tc['function'] is defined else tc -%}
{{- '<|tool_call>call:' + f['name'] + (gval(f['arguments']) if f['arguments'] is mapping else (f['arguments'] | string)) + '<tool_call|>' -}}
{%- endfor -%}
{%- if not (role == 'model' and message['tool_calls']) -%}{{- '<turn|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{%- if loop_messages and loop_messages[-1]['role'] == 'tool' -%}{%- else -%}{{- '<|turn>model\n' -}}{%- endif -%}
{%- if not thinking -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}
{%- endif -%}"""

# MiniCPM5: ChatML with a literal <s>, <think>, XML tool calls
# <function name="f"><param name="p">v</param></function> (CDATA when needed).
MINICPM5_TEMPLATE = _MARK + r"""{{- bos_token }}
{%- macro render_tools(tools) -%}
{{- '# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nTool usage guidelines:\n- You may call zero or more functions. If no function calls are needed, just answer normally and do not include any <function ... </function>.\n- When calling a function, return an XML object within <function ... </function> using:\n<function name="function-name"><param name="param-name">param-value</param></function>\n- param-value may be multi-line. If it contains <, & or newline characters, wrap it in a CDATA block: <param name="param-name"><![CDATA[...multi-line value...]]></param>' }}
{%- endmacro -%}
{%- if tools %}{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}
{%- if '<tool_def_sep>' in messages[0].content %}{{- messages[0].content.replace('<tool_def_sep>', render_tools(tools)) }}
{%- else %}{{- messages[0].content + '\n\n' + render_tools(tools) }}{%- endif %}
{%- else %}{{- render_tools(tools) }}{%- endif %}{{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\n' }}
{%- if message.reasoning_content is string and message.reasoning_content %}{{- '<think>\n' + message.reasoning_content.strip('\n') + '\n</think>\n\n' }}{%- endif %}
{{- content }}
{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{%- if (loop.first and content) or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<function name="' ~ tool_call.name ~ '">' }}
{%- if tool_call.arguments is mapping %}{%- for param_name, value in tool_call.arguments.items() %}
{%- set text = value if value is string else (value | tojson) %}{{- '<param name="' ~ param_name ~ '">' }}
{%- if value is string and ('<' in text or '&' in text or '\n' in text) %}{{- '<![CDATA[' + text + ']]>' }}{%- else %}{{- text }}{%- endif %}{{- '</param>' }}
{%- endfor %}{%- endif %}{{- '</function>' }}
{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined %}{%- if enable_thinking %}{{- '<think>\n' }}{%- else %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}
{%- endif %}"""

CHAT_TEMPLATES = {"llama": CHATML_TEMPLATE, "qwen3": QWEN3_TEMPLATE, "qwen3_5": QWEN35_TEMPLATE,
                  "gemma4_text": GEMMA4_TEMPLATE, "minicpm": MINICPM5_TEMPLATE}

_QWEN_CONTROL = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
_GEMMA4_LOW = [
    (0, "<pad>", True), (1, "<eos>", True), (2, "<bos>", True), (3, "<unk>", True), (4, "<mask>", True),
    (46, "<|tool>", True), (47, "<tool|>", True), (48, "<|tool_call>", True), (49, "<tool_call|>", True),
    (50, "<|tool_response>", True), (51, "<tool_response|>", True), (52, '<|"|>', True),
    (98, "<|think|>", True), (100, "<|channel>", True), (101, "<channel|>", True),
    (105, "<|turn>", True), (106, "<turn|>", True),
]
_GEMMA4_MM = ["<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>"]
_MINICPM5_LOW = [
    (0, "<s>", True), (1, "</s>", True), (2, "<tool_call>", True), (3, "</tool_call>", True),
    (4, "<unk>", True), (8, "<think>", False), (9, "</think>", False), (10, "<tool_response>", True),
    (11, "</tool_response>", True), (12, "<tools>", True), (13, "</tools>", True),
    (18, "<function", True), (19, "</function>", True), (20, "<param", True), (21, "</param>", True),
] + [(i, f"<|reserved_{i}|>", True) for i in (5, 6, 7, 14, 15, 16, 17)]

_QWEN3_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN35_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"""
              r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_MINICPM_RE = (r"""\p{N}|(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or from at which but have an "
    "they you were her she there one all we their can has more when will would if so what about up out "
    "them some time could into only other then its two these may first new like over also after any most "
    "where through back way well down should because each just those people how too little good very make "
    "world still model token server request response cache batch stream prompt reply answer question system "
    "user assistant tool call function weather city temperature result error value number list string "
    "object array field message content text chunk event delta stop length reason usage input output "
    "reasoning think plan step check test image picture photo describe color red green blue cat dog house"
).split()
_FIXED = [
    "The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '<function name="get_weather"><param name="city">Paris</param></function>',
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "call:get_weather{city:Paris,unit:celsius}", "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 -7",
    "Punctuation: a-b, c; d: e! f? (g) [h] {i} <j> 'k' \"l\" m/n o\\p q|r s_t u~v w@x y#z $1 %2 ^3 &4 *5",
    "Unicode: café, naïve, Straße, 東京, こんにちは, 你好, Привет, 😀 → ∑ π", "Tabs\tand\nnewlines\r\nand  spaces.",
]


@dataclass(frozen=True)
class GeneratedTokenizer:
    """A generated tokenizer; the JSON texts are ready to write."""

    tokenizer_json: str
    tokenizer_config: str
    special_tokens_map: str
    ids: Mapping[str, int]  # every added token -> id
    num_tokens: int  # max id + 1


def _corpus() -> list[str]:
    rng = random.Random(1234)
    lines = list(_FIXED) * 20
    for _ in range(2500):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.5:
            words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", "?", "!", "", "."]) + (
            f" {rng.randint(0, 9999)}" if rng.random() < 0.2 else ""))
    return lines


def _pipeline(kind: str, split_re: str | None) -> dict:
    """normalizer / pre_tokenizer / decoder as the family's transformers class builds them."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    if kind == "spm":  # GemmaTokenizer
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        tok = Tokenizer(models.BPE())
        if split_re is None:  # GPT2Tokenizer (SmolLM2)
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:  # Qwen2Tokenizer / Qwen3_5Tokenizer / MiniCPM5's tokenizer.json
            tok.normalizer = normalizers.NFC() if split_re != _MINICPM_RE else None
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split_re), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    d = json.loads(tok.to_str())
    return {k: d[k] for k in ("normalizer", "pre_tokenizer", "decoder")}


@functools.cache
def _trained(kind: str, split_re: str | None) -> str:
    """Train the BPE once per process; returns the tokenizer JSON text."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "spm":  # SentencePiece-converted layout: "▁" for spaces, <0xNN> byte fallback
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
        trainer = trainers.BpeTrainer(vocab_size=1757, min_frequency=2, show_progress=False,
                                      special_tokens=["<unk>"] + [f"<0x{i:02X}>" for i in range(256)])
    else:
        tok = Tokenizer(models.BPE())
        pre = [pre_tokenizers.Split(Regex(split_re), behavior="isolated")] if split_re else []
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            pre + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_re is None)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def _layout(kind, split_re, low, trailing, pinned=(), bos_post=None) -> tuple[dict, list]:
    """Place `low` (id, content, special) at fixed ids, the learned pieces in
    the remaining ids, then `trailing` (content, special) right after them."""
    data = json.loads(_trained(kind, split_re))
    data.update(_pipeline(kind, split_re))
    reserved = {i for i, _, _ in low} | {i for i, _ in pinned}
    taken = {c for _, c, _ in low} | {c for _, c in pinned}
    vocab = {c: i for i, c, _ in low} | {c: i for i, c in pinned}
    nxt = 0
    for content, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if content in taken:
            continue
        while nxt in reserved:
            nxt += 1
        vocab[content] = nxt
        nxt += 1
    added = list(low)
    for content, special in trailing:
        while nxt in reserved:
            nxt += 1
        vocab[content] = nxt
        added.append((nxt, content, special))
        nxt += 1
    data["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    added.sort()
    data["added_tokens"] = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": s} for i, c, s in added]
    if bos_post:
        b = {"SpecialToken": {"id": bos_post, "type_id": 0}}
        data["post_processor"] = {
            "type": "TemplateProcessing", "single": [b, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [b, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": bos_post, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos_post: {"id": bos_post, "ids": [vocab[bos_post]], "tokens": [bos_post]}}}
    elif split_re in (_QWEN3_RE,):
        data["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                  "use_regex": False}
    return data, added


def _config(family: str) -> dict:
    base = {"clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATES[family]}
    if family == "llama":
        return {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "model_max_length": 8192, **base}
    if family in ("qwen3", "qwen3_5"):
        return {"tokenizer_class": "Qwen2Tokenizer" if family == "qwen3" else "Qwen3_5Tokenizer",
                "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace", "model_max_length": 131072,
                "split_special_tokens": False, **base}
    if family == "gemma4_text":
        return {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
                "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                "mask_token": "<mask>", "padding_side": "left", "model_max_length": 131072,
                "spaces_between_special_tokens": False, "boi_token": "<|image>", "eoi_token": "<image|>",
                "image_token": "<|image|>", "soc_token": "<|channel>", "eoc_token": "<channel|>",
                "sot_token": "<|turn>", "eot_token": "<turn|>", "stc_token": "<|tool_call>",
                "etc_token": "<tool_call|>", "std_token": "<|tool>", "etd_token": "<tool|>",
                "str_token": "<|tool_response>", "etr_token": "<tool_response|>", "escape_token": '<|"|>',
                "think_token": "<|think|>", **base}
    return {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
            "bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "</s>", "unk_token": "<unk>",
            "model_max_length": 131072, **base}


@functools.cache
def generated_tokenizer(family: str) -> GeneratedTokenizer:
    """The generated tokenizer files for `family` (one of CHAT_TEMPLATES)."""
    if family == "llama":
        low = [(0, "<|endoftext|>", True), (1, "<|im_start|>", True), (2, "<|im_end|>", True)]
        data, added = _layout("bytelevel", None, low, [])
    elif family == "qwen3":
        data, added = _layout("bytelevel", _QWEN3_RE, [], _QWEN_CONTROL)
    elif family == "qwen3_5":
        extra = ["<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                 "<tts_text_bos_single>", "<|audio_pad|>"]
        data, added = _layout("bytelevel", _QWEN35_RE, [], _QWEN_CONTROL + [(c, True) for c in extra])
    elif family == "gemma4_text":
        data, added = _layout("spm", None, _GEMMA4_LOW, [(c, True) for c in _GEMMA4_MM],
                              pinned=[(107, "\n")], bos_post="<bos>")
    elif family == "minicpm":
        data, added = _layout("bytelevel", _MINICPM_RE, _MINICPM5_LOW,
                              [("<|im_start|>", True), ("<|im_end|>", True)], bos_post="<s>")
    else:
        raise ValueError(f"no generated tokenizer for {family!r}")
    cfg = _config(family)
    cfg["added_tokens_decoder"] = {
        str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": s} for i, c, s in added}
    stm = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg.get(k)}
    stm["additional_special_tokens"] = [c for _, c, s in added if s and c not in stm.values()]
    ids = {c: i for i, c, _ in added}
    return GeneratedTokenizer(
        tokenizer_json=json.dumps(data, ensure_ascii=False, indent=2) + "\n",
        tokenizer_config=json.dumps(cfg, ensure_ascii=False, indent=2) + "\n",
        special_tokens_map=json.dumps(stm, ensure_ascii=False, indent=2) + "\n",
        ids=MappingProxyType(ids), num_tokens=max(data["model"]["vocab"].values()) + 1)
