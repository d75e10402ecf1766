"""The plugin host built directly: isolation, provenance, duplicates, env switches."""

from __future__ import annotations

import pytest

from mlxrt import ModelInfo, ThinkingFormat, hookimpl
from mlxrt.errors import PluginError
from mlxrt.host import make_host

INFO = ModelInfo(model_id="m", path=None, model_type="qwen3", special_tokens={"<think>": 1})


class Override:
    @hookimpl
    def mlxrt_thinking_format(self, info):
        return ThinkingFormat(open="<a>", close="</a>")


def test_builtins_load_from_entry_points():
    host = make_host()
    assert {"qwen", "minicpm5", "gemma4", "diffusion_gemma", "openai"} <= {r.name for r in host.loaded()}


def test_first_answer_reports_the_plugin_and_third_parties_win():
    host = make_host(extra=[("override", Override())])
    assert host.first_answer("mlxrt_thinking_format", info=INFO) == (
        "override", ThinkingFormat(open="<a>", close="</a>"))
    plugin, fmt = make_host().first_answer("mlxrt_thinking_format", info=INFO)
    assert plugin == "qwen" and fmt.open == "<think>"


def test_a_raising_hook_names_its_plugin():
    class Bad:
        @hookimpl
        def mlxrt_thinking_format(self, info):
            raise KeyError("nope")

    host = make_host(entry_points=False, extra=[("bad", Bad())])
    with pytest.raises(PluginError) as err:
        host.first_answer("mlxrt_thinking_format", info=INFO)
    assert err.value.plugin == "bad" and err.value.hook == "mlxrt_thinking_format"


def test_duplicate_name_is_recorded_not_silent():
    host = make_host(entry_points=False, extra=[("twin", Override()), ("twin", Override())])
    records = list(host.records.values())
    assert records[0].status == "loaded"
    assert records[1].status == "failed" and "duplicate name" in records[1].error


def test_invalid_hookimpl_is_isolated():
    class Wrong:
        @hookimpl
        def mlxrt_thinking_format(self, info, not_an_argument):
            return None

    host = make_host(entry_points=False, extra=[("wrong", Wrong()), ("fine", Override())])
    assert host.plugin("wrong").status == "failed" and "not_an_argument" in host.plugin("wrong").error
    assert host.plugin("fine").status == "loaded"
    assert host.first_answer("mlxrt_thinking_format", info=INFO)[0] == "fine"


def test_disable_via_environment(monkeypatch):
    monkeypatch.setenv("MLXRT_DISABLE_PLUGINS", "qwen, gemma4")
    host = make_host()
    assert host.plugin("qwen").status == "disabled" and host.plugin("gemma4").status == "disabled"
    assert host.first_answer("mlxrt_thinking_format", info=INFO) == (None, None)


def test_hook_kinds():
    host = make_host()
    assert host.plugin("qwen").kind == "family" and host.plugin("openai").kind == "dialect"
    assert "mlxrt_thinking_format" in host.plugin("qwen").hooks


def test_plugin_state_lives_with_its_host():
    from mlxrt.host import make_host

    one, two = make_host(), make_host()
    made = []
    first = one.plugin_state("p", lambda: made.append(1) or object())
    assert one.plugin_state("p", object) is first and len(made) == 1  # made once per host
    assert two.plugin_state("p", object) is not first
