"""The kind a plugin is listed with (``mlxrt plugins``): a family is a plugin implementing a hook
called once per model load; per-request hooks do not make one."""

from __future__ import annotations

import re

from mlxrt import hookimpl, hookspecs
from mlxrt.host import FAMILY_HOOKS, make_host


def test_family_hooks_are_the_hooks_called_per_model_load():
    per_load = {name for name, spec in vars(hookspecs).items()
                if name.startswith("mlxrt_") and re.search(r"Called \w+ per model load", spec.__doc__ or "")}
    assert per_load and FAMILY_HOOKS == per_load


class Effort:
    """Maps reasoning_effort for every model: a per-request hook."""

    @hookimpl
    def mlxrt_chat_template_kwargs(self, info, request):
        return None


class ToolPrompt:
    """A family's tool prompt: a per-model-load hook."""

    @hookimpl
    def mlxrt_tool_prompt(self, info):
        return None


def test_a_per_request_hook_does_not_make_a_family_and_a_per_load_hook_does():
    host = make_host(entry_points=False, extra=[("effort", Effort()), ("tool-prompt", ToolPrompt())])
    assert host.records["effort"].kind == "other"
    assert host.records["tool-prompt"].kind == "family"
