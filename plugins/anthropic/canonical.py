"""Prompt-cache hygiene for Claude Code: its per-request billing header line.

Claude Code (≥ 2.1) sends ``x-anthropic-billing-header: cc_version=…; cc_entrypoint=…;
cch=<hash>;`` as the first block of its system prompt. The ``cch`` hash changes on every
request, and it sits at the very top of the prompt, so without this every turn of an agent
loop would miss the prompt cache from token ~10 on. The line means nothing to the model.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from mlxrt.records import GenerationRequest

__all__ = ["BILLING_HEADER", "strip_billing_header", "canonical_request"]

BILLING_HEADER = "x-anthropic-billing-header:"
_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)
#: The header sits in the system turn, within the prompt's first few hundred tokens.
_PREFIX_TOKENS = 512


def strip_billing_header(text: str) -> str:
    """``text`` without its first billing-header line (unchanged when there is none)."""
    return _LINE.sub("", text, count=1)


def canonical_request(request: GenerationRequest, tokenizer: Any) -> GenerationRequest | None:
    """``request`` with the billing header cut out of its prompt, or ``None`` when it has none.

    The header is looked for in the decoded first tokens only (cheap); when it is there, the
    prompt is decoded, the line removed and the text re-encoded the way the chat route
    tokenizes rendered prompts, so every turn yields the same ids for the same conversation.
    """
    ids = list(request.prompt_ids)
    if BILLING_HEADER not in tokenizer.decode(ids[:_PREFIX_TOKENS], skip_special_tokens=False):
        return None
    text = tokenizer.decode(ids, skip_special_tokens=False)
    stripped = strip_billing_header(text)
    if stripped == text:
        return None
    return attrs.evolve(request, prompt_ids=tuple(tokenizer.encode(stripped, add_special_tokens=False)))
