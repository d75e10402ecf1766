"""Chat templates by name, for ``mlxrt serve --chat-template NAME`` (llama-server accepts the
same names for its built-in formats): ``chatml``, ``llama3``, ``command-r``, ``gemma``,
``mistral-v7``, ``phi3``, ``zephyr``.

Each is a small Jinja template written here for the format's turn markup (text messages; a
message given as content parts renders its text parts). Like llama-server's built-in formats,
a named template carries no BOS of its own: the served model's tokenizer decides —
:func:`chat_template_text` starts the template with ``{{ bos_token }}`` when the tokenizer adds
a BOS to plain text by itself (a Llama 3 or Gemma tokenizer does, a ChatML model's does not),
because mlxrt tokenizes a rendered prompt without adding special tokens again. None renders
tools: with a named template the generic tool prompt writes them into the messages.

:func:`chat_template_text` also takes a template file's path (its text) or Jinja text itself;
anything else is an error naming the built-in names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["NAMED_TEMPLATES", "chat_template_text"]

#: A message's text: its content when a string, else its text parts, one per line.
_TEXT = ("{%- set text = message['content'] if message['content'] is string else "
         "(message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n')) %}")

_CHATML = (
    "{%- for message in messages %}" + _TEXT
    + "{{ '<|im_start|>' + message['role'] + '\\n' + text + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

_LLAMA3 = (
    "{%- for message in messages %}" + _TEXT
    + "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (text | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_COMMAND_R = (
    "{%- set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} %}"
    "{%- for message in messages %}" + _TEXT
    + "{%- if message['role'] in tokens %}"
    "{{ '<|START_OF_TURN_TOKEN|>' + tokens[message['role']] + (text | trim) + '<|END_OF_TURN_TOKEN|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif %}"
)

# Gemma has no system turn: system text opens the next user turn, as Google's template does.
_GEMMA = (
    "{%- set ns = namespace(system='') %}"
    "{%- for message in messages %}" + _TEXT
    + "{%- if message['role'] == 'system' %}"
    "{%- set ns.system = ns.system + (text | trim) %}"
    "{%- else %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{%- if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' %}{%- endif %}"
    "{{ (text | trim) + '<end_of_turn>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
)

# Mistral's v7 format: the answer follows [/INST] directly; an assistant turn ends with </s>.
_MISTRAL_V7 = (
    "{%- for message in messages %}" + _TEXT
    + "{%- if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + text + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{ '[INST] ' + text + '[/INST]' }}"
    "{%- else %}{{ ' ' + text + '</s>' }}"
    "{%- endif %}"
    "{%- endfor %}"
)

_PHI3 = (
    "{%- for message in messages %}" + _TEXT
    + "{{ '<|' + message['role'] + '|>\\n' + text + '<|end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}"
)

_ZEPHYR = (
    "{%- for message in messages %}" + _TEXT
    + "{{ '<|' + message['role'] + '|>\\n' + text + '<|endoftext|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}"
)

#: The built-in chat templates by name (without the BOS :func:`chat_template_text` may add).
NAMED_TEMPLATES: dict[str, str] = {
    "chatml": _CHATML,
    "llama3": _LLAMA3,
    "command-r": _COMMAND_R,
    "gemma": _GEMMA,
    "mistral-v7": _MISTRAL_V7,
    "phi3": _PHI3,
    "zephyr": _ZEPHYR,
}


def _adds_bos(tokenizer: Any) -> bool:
    try:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None and isinstance(getattr(tokenizer, "bos_token", None), str):
            bos = tokenizer.convert_tokens_to_ids(tokenizer.bos_token)
        return bos is not None and list(tokenizer.encode("a", add_special_tokens=True))[:1] == [bos]
    except Exception:  # a tokenizer that cannot say: no BOS, as for most chat formats
        return False


def chat_template_text(value: str, tokenizer: Any = None) -> str:
    """The Jinja text ``--chat-template VALUE`` stands for: a built-in name's template
    (:data:`NAMED_TEMPLATES`; with ``{{ bos_token }}`` first when ``tokenizer`` adds a BOS by
    itself), the text of an existing template file, or ``value`` itself when it is Jinja (it has
    ``{{`` or ``{%``). Raises :class:`ValueError` naming the built-in names otherwise."""
    if value in NAMED_TEMPLATES:
        return ("{{ bos_token }}" if tokenizer is not None and _adds_bos(tokenizer) else "") + NAMED_TEMPLATES[value]
    if "{{" in value or "{%" in value:
        return value
    if "\n" not in value and len(value) < 4096:
        path = Path(value).expanduser()
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise ValueError(f"{value!r} is not a built-in chat template ({', '.join(NAMED_TEMPLATES)}), "
                     "a template file or Jinja template text")
