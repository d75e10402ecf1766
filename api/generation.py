"""Where the pipeline's parts a dialect may use on its own used to live, kept so existing
imports work; each now has its own module:

- response headers: :mod:`mlxrt.api.headers`;
- the overlong-body check: :mod:`mlxrt.api.text_limits`;
- turn observers: :mod:`mlxrt.api.observers`;
- output-format decoding: :mod:`mlxrt.api.output_format`;
- stream framing and error frames: :mod:`mlxrt.api.framing`;
- a tool call's arguments as an object: :func:`mlxrt.api.wire.tool_input`;
- ``tool_choice`` enforcement: :func:`mlxrt.serving.forced_tool_call` (part of planning).
"""

from __future__ import annotations

from mlxrt.api.framing import FrameWriter, assembled_stream, guarded, merged
from mlxrt.api.headers import CACHE_HEADER, response_headers
from mlxrt.api.observers import turn_observer
from mlxrt.api.output_format import json_schema_output, structured_output
from mlxrt.api.text_limits import MAX_CHARS_PER_TOKEN, check_text_length, refuse_overlong_text
from mlxrt.api.wire import tool_input

__all__ = ["CACHE_HEADER", "response_headers", "guarded", "merged", "tool_input", "FrameWriter",
           "assembled_stream", "structured_output", "json_schema_output", "turn_observer",
           "refuse_overlong_text", "check_text_length", "MAX_CHARS_PER_TOKEN"]
