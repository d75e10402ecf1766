"""Sampler plugins: the HLG tone curve and the curve sampler (built-in), and a third-party one.

Unit tests check the transforms on small log-probability vectors against the formulas in
docs/samplers.md; HTTP tests register the plugins explicitly (``make_host(extra=...)``) and
compare seeded generations with a test-local oracle sampler; the last tests pip-install
``tests/fixture-plugins/mlxrt-sampler-example`` into a folder and show through a real
``mlxrt serve`` that it changes the generated text without any change to mlxrt.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import click
import httpx
import mlx.core as mx
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from support import MLXRT_BIN, openai_client

import mlxrt.plugins.curve as curve_plugin
import mlxrt.plugins.hlg as hlg_plugin
from mlxrt import hookimpl
from mlxrt.cli import build_cli
from mlxrt.errors import InvalidRequest
from mlxrt.host import make_host
from mlxrt.plugins.curve.params import MAX_POINTS, parse_curve, pchip_tangents
from mlxrt.plugins.curve.spline import apply_curve
from mlxrt.plugins.hlg.settings import HlgSettings, request_overrides, resolve, server_settings
from mlxrt.plugins.hlg.tone import tone_curve

REPO = Path(__file__).resolve().parents[1]
SAMPLER_EXAMPLE = REPO / "tests" / "fixture-plugins" / "mlxrt-sampler-example"
NEG_INF = -math.inf
IDENTITY = {"space": "logprob", "monotonic": True, "points": [
    {"x_pct": 1e-4, "y_pct": 1e-4}, {"x_pct": 0.1, "y_pct": 0.1}, {"x_pct": 1, "y_pct": 1},
    {"x_pct": 9, "y_pct": 9}, {"x_pct": 100, "y_pct": 100}]}


def logprobs(values):
    row = mx.array([values], dtype=mx.float32)
    return row - mx.logsumexp(row, axis=-1, keepdims=True)


def as_list(a):
    return a.tolist()[0]


def softmax(a):
    return mx.softmax(a, axis=-1)


def assert_non_decreasing_in(inputs, outputs):
    pairs = sorted(zip(inputs, outputs, strict=True))
    for (_, lo), (_, hi) in zip(pairs, pairs[1:], strict=False):
        assert hi >= lo - 1e-4


def points(*pairs):
    return {"points": [{"x_pct": x, "y_pct": y} for x, y in pairs]}


# -- HLG: the tone curve ---------------------------------------------------------------------


def hlg_scalar(z, m, w, shoulder, toe):
    """docs/samplers.md's g(z), written out per branch in plain Python."""
    if z > w and shoulder > 0:
        return m * w + m * shoulder * math.log(1 + (z - w) / shoulder)
    if z < -w and toe > 0:
        return -m * w - m * toe * math.log(1 + (-z - w) / toe)
    return m * z


def test_hlg_curve_matches_the_formula_branch_by_branch():
    lp = mx.array([[0.0, -1.0, -3.0, -6.0, -9.0, -12.0, -20.0, -40.0]])  # top at 0: z = ℓ + 6
    for s, t in [(HlgSettings(), 1.0), (HlgSettings(width=1, shoulder=0.5, toe=2, pivot_offset=3), 0.7)]:
        got = as_list(tone_curve(lp, s, t))
        want = [hlg_scalar(v + s.pivot_offset, 1 / t, s.width, s.shoulder, s.toe) for v in as_list(lp)]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_hlg_without_knees_is_exactly_temperature():
    lp = logprobs([2.0, 1.0, 0.5, -3.0, -10.0])
    for s in (HlgSettings(shoulder=0, toe=0), HlgSettings(width=100)):
        assert as_list(softmax(tone_curve(lp, s, 0.5))) == pytest.approx(as_list(softmax(lp / 0.5)), abs=1e-6)


def test_hlg_is_continuous_with_a_continuous_slope_at_the_knees():
    s, eps = HlgSettings(width=2, shoulder=3, toe=1, pivot_offset=4), 1e-3
    for knee in (s.width, -s.width):
        z = mx.array([[knee - eps, knee, knee + eps]]) - s.pivot_offset  # top is 0 in this row
        row = mx.concatenate([mx.array([[0.0]]), z], axis=-1)
        _, before, at, after = as_list(tone_curve(row, s, 1.0))
        assert after - at == pytest.approx(at - before, rel=1e-2)  # slope 1·m on both sides
        assert after - at == pytest.approx(eps, rel=1e-2)


def test_hlg_keeps_masked_tokens_masked_and_mass_sums_to_one():
    lp = logprobs([3.0, 1.0, NEG_INF, -2.0, NEG_INF])
    probs = as_list(softmax(tone_curve(lp, HlgSettings(), 0.8)))
    assert probs[2] == 0 and probs[4] == 0
    assert sum(probs) == pytest.approx(1.0, abs=1e-6)
    assert max(range(5), key=probs.__getitem__) == 0


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-30, 5), min_size=2, max_size=24),
    knobs=st.tuples(*[st.floats(0, 100)] * 4),
    temperature=st.floats(0.05, 5),
)
def test_hlg_preserves_the_ranking_of_tokens(values, knobs, temperature):
    s = HlgSettings(True, *knobs)
    lp = logprobs(values)
    out = tone_curve(lp, s, temperature)
    assert_non_decreasing_in(as_list(lp), as_list(out))
    assert all(math.isfinite(v) for v in as_list(out))
    assert sum(as_list(softmax(out))) == pytest.approx(1.0, abs=1e-5)


# -- HLG: settings ---------------------------------------------------------------------------


def test_hlg_settings_server_defaults_and_field_by_field_overrides():
    assert server_settings({}) == HlgSettings(False, 4, 4, 6, 6)
    server = {"hlg_sampling": "on", "hlg_width": 2.0, "hlg_shoulder": 4.0, "hlg_toe": 6.0, "hlg_pivot_offset": 6.0}
    assert resolve(server, None) == HlgSettings(True, 2, 4, 6, 6)
    assert resolve(server, {"toe": 1, "shoulder": None}) == HlgSettings(True, 2, 4, 1, 6)
    assert resolve(server, {"enabled": False}).enabled is False
    assert resolve({}, {"enabled": True}) == HlgSettings(True, 4, 4, 6, 6)


@pytest.mark.parametrize(("value", "message"), [
    ({"width": -1}, "hlg.width must be at least 0"),
    ({"toe": 101}, "hlg.toe must be at most 100"),
    ({"shoulder": "4"}, "hlg.shoulder must be of type ('float', 'int')"),
    ({"pivot_offset": True}, "hlg.pivot_offset must be of type ('float', 'int')"),
    ({"width": math.nan}, "hlg.width must be a number, not NaN"),
    ({"enabled": "yes"}, "hlg.enabled must be of type bool"),
    ({"pivotOffset": 6}, "hlg has unknown field 'pivotOffset'; allowed: enabled, width, shoulder, toe, pivot_offset"),
    ([1], "hlg must be of type dict"),
])
def test_hlg_settings_validation(value, message):
    with pytest.raises(InvalidRequest) as err:
        request_overrides(value)
    assert err.value.message == message


# -- The curve sampler -----------------------------------------------------------------------


def test_identity_curve_is_the_identity_everywhere():
    curve = parse_curve(IDENTITY)
    lp = [-40.0, -13.0, -9.2, -5.0, -2.4, -1.0, -0.1, 0.0]
    assert as_list(apply_curve(mx.array([lp]), curve)) == pytest.approx(lp, abs=1e-4)


def test_curve_passes_through_its_knots_and_is_linear_beyond_them():
    curve = parse_curve(points((50, 90), (1, 0.5), (10, 40), (100, 100)))
    xs = [math.log(p / 100) for p in (1, 10, 50, 100)]
    ys = [math.log(p / 100) for p in (0.5, 40, 90, 100)]
    assert as_list(apply_curve(mx.array([xs]), curve)) == pytest.approx(ys, abs=1e-5)
    below = as_list(apply_curve(mx.array([[xs[0] - 1, xs[0] - 2]]), curve))
    assert below[0] - below[1] == pytest.approx(curve.below_slope, rel=1e-5)
    assert curve.below_slope == max(curve.slopes[0], 1.0)


def test_two_point_curve_is_a_line():
    curve = parse_curve(points((1, 0.1), (100, 100)))
    slope = math.log(1000) / math.log(100)
    u = [-4.0, -3.0, -1.5, -0.5]
    assert as_list(apply_curve(mx.array([u]), curve)) == pytest.approx([slope * v for v in u], abs=1e-5)


def test_pchip_tangents_flatten_at_a_turn_and_average_harmonically():
    assert pchip_tangents([0, 1, 2], [0, 1, 1]) == (1, 0, 0)
    d0, d1 = 1.0, 4.0  # equal spacing: the weights are equal, a plain harmonic mean
    assert pchip_tangents([0, 1, 2], [0, d0, d0 + d1])[1] == pytest.approx(2 / (1 / d0 + 1 / d1))


def test_curve_keeps_masked_tokens_masked_and_mass_sums_to_one():
    curve = parse_curve(points((0.01, 1), (5, 20), (100, 100)))  # flattens: more diverse than T=1
    lp = logprobs([2.0, 0.0, NEG_INF, -4.0, -12.0])
    probs = as_list(softmax(apply_curve(lp, curve)))
    assert probs[2] == 0 and sum(probs) == pytest.approx(1.0, abs=1e-6)
    base = as_list(softmax(lp))
    assert probs[0] < base[0] and probs[3] > base[3]


monotone_points = st.lists(
    st.tuples(st.floats(0.001, 100), st.floats(0.001, 100)), min_size=2, max_size=10,
    unique_by=lambda p: round(math.log(p[0]), 6),
).map(lambda pts: list(zip(sorted(p[0] for p in pts), sorted(p[1] for p in pts), strict=True)))


@settings(max_examples=60, deadline=None)
@given(pts=monotone_points, values=st.lists(st.floats(-40, 0), min_size=2, max_size=24))
def test_every_valid_curve_is_monotone_and_keeps_mass(pts, values):
    curve = parse_curve(points(*pts))
    out = as_list(apply_curve(mx.array([values]), curve))
    assert_non_decreasing_in(values, out)
    assert all(math.isfinite(v) for v in out)
    assert sum(as_list(softmax(mx.array([out])))) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(("value", "message"), [
    (points((1, 10), (10, 5), (100, 100)),
     "curve is not monotone — all segment slopes must be ≥ 0: the segment from x_pct=1 to x_pct=10 "
     "falls from y_pct=10 to y_pct=5"),
    (points((10, 10), (10, 20)), "curve.points: two points share x_pct=10"),
    (points((10, 10)), f"curve.points must be an array of 2 to {MAX_POINTS} points"),
    (points(*[(i + 1, i + 1) for i in range(MAX_POINTS + 1)]), f"curve.points must be an array of 2 to {MAX_POINTS} points"),
    ({"points": [{"x_pct": 1, "y_pct": 1}, {"x_pct": 2}]}, "curve.points[1].y_pct is required"),
    ({"points": [{"x_pct": 1, "y_pct": 1}, {"x_pct": 2, "y_pct": 120}]}, "curve.points[1].y_pct must be at most 100"),
    ({"points": [{"x_pct": -1, "y_pct": 1}, {"x_pct": 2, "y_pct": 2}]}, "curve.points[0].x_pct must be at least 0"),
    ({"points": [{"x_pct": "1", "y_pct": 1}, {"x_pct": 2, "y_pct": 2}]},
     "curve.points[0].x_pct must be of type ('float', 'int')"),
    ({"points": [[1, 1], [2, 2]]}, "curve.points[0] must be an object with x_pct and y_pct"),
    ({"points": [{"x_pct": math.nan, "y_pct": 1}, {"x_pct": 2, "y_pct": 2}]}, "curve.points[0] must hold numbers, not NaN"),
    ({**points((1, 1), (2, 2)), "space": "prob"}, "curve.space must be 'logprob', not 'prob'"),
    ({**points((1, 1), (2, 2)), "monotonic": False}, "curve.monotonic must be true: only monotone curves are supported"),
    ({**points((1, 1), (2, 2)), "gain": 2}, "curve has unknown field 'gain'; allowed: space, points, monotonic"),
])
def test_curve_validation_names_the_reason(value, message):
    with pytest.raises(InvalidRequest) as err:
        parse_curve(value)
    assert err.value.message == message


def test_flat_curve_is_monotone_and_zero_percent_is_a_valid_knot():
    flat = parse_curve(points((0, 50), (100, 50)))
    assert flat.slopes == (0.0, 0.0)


# -- Through HTTP, plugins registered explicitly ----------------------------------------------


class Oracle:
    """A test-local sampler: ``categorical(lp / T)`` or the k-th most likely token."""

    def __init__(self, temperature=None, rank=None):
        self.temperature, self.rank = temperature, rank

    @hookimpl
    def mlxrt_sampler(self, request):
        if self.rank is not None:
            return lambda lp: mx.argsort(-lp, axis=-1)[:, self.rank]
        return lambda lp: mx.random.categorical(lp * (1 / self.temperature))


def body(**kw):
    return {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 16, "seed": 7, **kw}


def text(client, **kw):
    resp = client.post("/v1/chat/completions", json=body(**kw))
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


def error(client, **kw):
    resp = client.post("/v1/chat/completions", json=body(**kw))
    return resp.status_code, resp.json()["error"]["message"]


def test_hlg_over_http(mlxrt_tiny_checkpoint, mlxrt_serve):
    model = mlxrt_tiny_checkpoint("llama")
    hlg = mlxrt_serve(model, plugins=[("hlg", hlg_plugin)])
    plain = mlxrt_serve(model)
    temperature = mlxrt_serve(model, plugins=[("oracle", Oracle(temperature=0.5))])
    reference = text(temperature, temperature=0.5)
    # Off by default: the default sampler runs.
    assert text(hlg, temperature=0.5) == text(plain, temperature=0.5)
    # Knees off: exactly temperature sampling, same draws.
    assert text(hlg, temperature=0.5, hlg={"enabled": True, "shoulder": 0, "toe": 0}) == reference
    # A strong shoulder flattens the head of the distribution: other tokens get drawn.
    squashed = text(hlg, temperature=0.5, hlg={"enabled": True, "width": 0, "shoulder": 0.1})
    assert squashed != reference
    # Greedy is unchanged by a monotone curve.
    assert text(hlg, temperature=0, hlg={"enabled": True}) == text(plain, temperature=0)


def test_hlg_server_default_and_request_overrides(mlxrt_tiny_checkpoint, mlxrt_serve):
    model = mlxrt_tiny_checkpoint("llama")
    on = mlxrt_serve(model, plugins=[("hlg", hlg_plugin)],
                   options={"hlg_sampling": "on", "hlg_width": 0.0, "hlg_shoulder": 0.1})
    hlg = mlxrt_serve(model, plugins=[("hlg", hlg_plugin)])
    plain = mlxrt_serve(model)
    squashed = text(hlg, temperature=0.5, hlg={"enabled": True, "width": 0, "shoulder": 0.1})
    assert text(on, temperature=0.5) == squashed
    assert text(on, temperature=0.5, hlg={"enabled": False}) == text(plain, temperature=0.5)
    # Field by field: the request's knobs over the server's.
    assert text(on, temperature=0.5, hlg={"shoulder": 0, "toe": 0}) == text(hlg, temperature=0.5, hlg={
        "enabled": True, "shoulder": 0, "toe": 0})


def test_curve_over_http(mlxrt_tiny_checkpoint, mlxrt_serve):
    model = mlxrt_tiny_checkpoint("llama")
    curved = mlxrt_serve(model, plugins=[("curve", curve_plugin), ("hlg", hlg_plugin)])
    plain = mlxrt_serve(model)
    t1 = mlxrt_serve(model, plugins=[("oracle", Oracle(temperature=1.0))])
    # The identity curve is temperature 1, whatever the request's temperature.
    assert text(curved, temperature=0, curve=IDENTITY) == text(t1, temperature=0)
    # It samples even at temperature 0, and wins over HLG.
    flat = points((0.01, 10), (100, 100))
    sampled = text(curved, temperature=0, curve=flat, hlg={"enabled": True})
    assert sampled == text(curved, temperature=0.3, curve=flat)
    assert sampled != text(plain, temperature=0)


def test_bad_sampler_fields_are_400s_stream_or_not(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("curve", curve_plugin), ("hlg", hlg_plugin)])
    falling = points((1, 10), (10, 5))
    for stream in (False, True):
        status, message = error(client, stream=stream, curve=falling)
        assert status == 400 and message.startswith("curve is not monotone — all segment slopes must be ≥ 0")
        assert error(client, stream=stream, hlg={"width": 500}) == (400, "hlg.width must be at most 100")
    assert error(client, hlg=True) == (400, "hlg must be of type dict")
    assert error(client, curve=[1, 2]) == (400, "curve must be of type dict")
    assert text(client, temperature=0)  # still serving


def test_hlg_serve_options():
    host = make_host(entry_points=False, extra=[("hlg", hlg_plugin)])
    runner = CliRunner()
    help_text = runner.invoke(build_cli(host), ["serve", "--help"]).output
    for flag in ("--hlg-sampling", "--hlg-width", "--hlg-shoulder", "--hlg-toe", "--hlg-pivot-offset"):
        assert flag in help_text
    bad = runner.invoke(build_cli(host), ["serve", "--hlg-width", "-1"])
    assert bad.exit_code == 2 and "--hlg-width" in bad.output
    missing = runner.invoke(build_cli(host), ["serve", "/nonexistent/model", "--hlg-sampling", "on", "--hlg-toe", "2"])
    assert missing.exit_code != 0
    assert server_settings(host.options) == HlgSettings(True, 4, 4, 2, 6)
    assert isinstance(hlg_plugin.mlxrt_serve_options()[0], click.Option)


# -- A third-party sampler plugin, pip-installed ----------------------------------------------


@pytest.fixture(scope="module")
def sampler_site(tmp_path_factory):
    target = tmp_path_factory.mktemp("sampler-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(SAMPLER_EXAMPLE)],
        check=True, capture_output=True, text=True,
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def test_third_party_sampler_is_discovered(sampler_site):
    out = subprocess.run([MLXRT_BIN, "plugins", "--json"], env=sampler_site, capture_output=True, text=True,
                         check=True, cwd="/")
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    rank = rows["rank"]
    assert rank["status"] == "loaded" and rank["kind"] == "sampler" and rank["builtin"] is False
    assert rank["dist"] == "mlxrt-sampler-example"
    assert rank["hooks"] == ["mlxrt_request_fields", "mlxrt_sampler", "mlxrt_serve_options"]


def test_third_party_sampler_changes_the_output(sampler_site, mlxrt_tiny_checkpoint, mlxrt_serve, server_process):
    model = mlxrt_tiny_checkpoint("llama")
    greedy = text(mlxrt_serve(model), temperature=0)
    second_best = text(mlxrt_serve(model, plugins=[("oracle", Oracle(rank=1))]), temperature=0)
    assert second_best != greedy

    request = dict(model="m", messages=body()["messages"], max_tokens=16, temperature=0)
    server = server_process([str(model)], env=sampler_site)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        client = openai_client(http)
        untouched = client.chat.completions.create(**request).choices[0].message.content
        ranked = client.chat.completions.create(**request, extra_body={"sample_rank": 1}).choices[0].message.content
        refused = http.post("/v1/chat/completions", json={**request, "sample_rank": -1})
    assert untouched == greedy  # without its field the plugin leaves sampling alone
    assert ranked == second_best  # with it, every token is the second most likely one
    assert refused.status_code == 400 and refused.json()["error"]["message"] == "sample_rank must be at least 0"

    by_flag = server_process([str(model), "--sample-rank", "1"], env=sampler_site)
    with httpx.Client(base_url=by_flag.url, timeout=60) as http:
        assert openai_client(http).chat.completions.create(**request).choices[0].message.content == second_best
