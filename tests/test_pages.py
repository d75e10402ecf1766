"""The pages plugin: the chat + status page (``/``), the curve designer (``/curves``) and its
``POST /v1/curves/sample`` endpoint.

HTTP tests run everywhere. The browser tests drive the system Chromium (Debian's ``chromium``)
through Python Playwright against a real server on a loopback port, and skip cleanly where
either is missing; their screenshots go to ``$MLXRT_ARTIFACTS`` (else the test's tmp folder),
and the path is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from support import free_port

from mlxrt import hookimpl

CHROMIUM = os.environ.get("MLXRT_CHROMIUM", "/usr/bin/chromium")
#: Chromium flags: no sandbox (containers, root), and nothing that phones home (issue 43). The
#: first set turns off most background services; headless Chromium 150 still fetched the
#: network time from clients2.google.com (off with the features below) and opened
#: accounts.google.com, android.clients.google.com and www.google.com whatever the flags, so
#: the host rules resolve every name but the loopback server's to nothing: no lookup, no
#: connection leaves the machine (test_the_browser_connects_to_nothing_but_the_server).
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-default-apps", "--no-first-run", "--metrics-recording-only",
                 "--disable-client-side-phishing-detection", "--disable-domain-reliability", "--no-pings",
                 "--disable-breakpad", "--disable-field-trial-config", "--safebrowsing-disable-auto-update",
                 "--disable-component-extensions-with-background-pages", "--no-default-browser-check",
                 "--disable-features=Translate,OptimizationHints,OptimizationHintsFetching,"
                 "OptimizationGuideModelDownloading,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication,"
                 "CertificateTransparencyComponentUpdater,NetworkTimeServiceQuerying,InterestFeedContentSuggestions,"
                 "PrivacySandboxSettings4,SafeBrowsing",
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
#: A monotone curve that sharpens the distribution's head.
SHARPEN = {"points": [{"x_pct": 0.01, "y_pct": 0.0001}, {"x_pct": 1, "y_pct": 0.5}, {"x_pct": 100, "y_pct": 100}]}
IDENTITY = {"points": [{"x_pct": 1, "y_pct": 1}, {"x_pct": 100, "y_pct": 100}]}
FALLING = {"points": [{"x_pct": 1, "y_pct": 50}, {"x_pct": 10, "y_pct": 5}, {"x_pct": 100, "y_pct": 100}]}
WORDS = " one two three four five six seven eight nine ten"


class Counting:
    """Samples WORDS' tokens over and over (no EOS: generation ends at max_tokens or a stop),
    slowly (STEP seconds a token), so a stream can be watched and stopped. Only for requests
    without a ``curve`` (the designer's samplers are its own)."""

    STEP = 0.03

    def __init__(self, info_path: Path):
        from tokenizers import Tokenizer

        self.ids = Tokenizer.from_file(str(info_path / "tokenizer.json")).encode(WORDS, add_special_tokens=False).ids

    @hookimpl
    def mlxrt_sampler(self, request):
        import mlx.core as mx

        step = 0

        def sample(logprobs):
            nonlocal step
            step += 1
            return mx.array([self.ids[(step - 1) % len(self.ids)]] * logprobs.shape[0])

        return sample

    @hookimpl
    def mlxrt_logits_processors(self, request):
        def slow(tokens, logits):
            time.sleep(self.STEP)
            return logits

        return [slow]


class ScriptAll:
    """Every chat answer is SCRIPT's tokens, then EOS: reasoning, a sentence and a tool call."""

    SCRIPT = ('<think>let me think</think>Sure.<tool_call>\n{"name": "get_weather", '
              '"arguments": {"city": "Paris"}}\n</tool_call>')

    def __init__(self, info_path: Path):
        from tokenizers import Tokenizer

        eos = json.loads((info_path / "generation_config.json").read_text())["eos_token_id"]
        tok = Tokenizer.from_file(str(info_path / "tokenizer.json"))
        self.ids = tok.encode(self.SCRIPT, add_special_tokens=False).ids + [eos if isinstance(eos, int) else eos[0]]

    @hookimpl
    def mlxrt_sampler(self, request):
        import mlx.core as mx

        ids = iter(self.ids)
        return lambda logprobs: mx.array([next(ids, self.ids[-1])])


class LiveServer:
    """The app of a tiny checkpoint served by uvicorn on a loopback port, in a thread."""

    def __init__(self, model: Path, extra=(), options=None):
        import uvicorn

        from mlxrt.cli import build_server
        from mlxrt.host import make_host

        self.host = make_host(extra=extra)
        app = self.app = build_server(self.host, str(model), {"host": "127.0.0.1", "port": 0, **(options or {})})
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.stop()
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.app.state.models.stop()


@pytest.fixture
def counting_server(mlxrt_tiny_checkpoint):
    model = mlxrt_tiny_checkpoint("qwen3")
    server = LiveServer(model, extra=[("counting", Counting(model))], options={"batch": 4})
    yield server
    server.stop()


@pytest.fixture
def script_server(mlxrt_tiny_checkpoint):
    model = mlxrt_tiny_checkpoint("qwen3")
    server = LiveServer(model, extra=[("script-all", ScriptAll(model))])
    yield server
    server.stop()


@pytest.fixture
def plain_server(mlxrt_tiny_checkpoint):
    server = LiveServer(mlxrt_tiny_checkpoint("qwen3"))
    yield server
    server.stop()


# -- HTTP: the pages are served, the JSON API is unaffected -------------------------------------


def test_pages_are_served_beside_the_json_api(mlxrt_client):
    page = mlxrt_client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/pages/assets/chat.js" in page.text and "<title>mlxrt" in page.text
    curves = mlxrt_client.get("/curves")
    assert curves.status_code == 200 and "/pages/assets/curves.js" in curves.text
    for name, kind in (("pages.css", "text/css"), ("common.js", "text/javascript"), ("curves.js", "text/javascript")):
        asset = mlxrt_client.get(f"/pages/assets/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind), name
    missing = mlxrt_client.get("/pages/assets/..%2Fpyproject.toml")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    # The JSON API is untouched: /health's exact bytes, /v1/models, the /v1 index lists the pages.
    assert mlxrt_client.get("/health").content == b'{"status": "ok"}'
    assert mlxrt_client.get("/v1/models").json()["data"][0]["object"] == "model"
    endpoints = mlxrt_client.get("/v1").json()["endpoints"]
    assert {"GET /", "GET /curves", "GET /pages/status", "POST /v1/curves/sample"} <= set(endpoints)


def test_status_lists_model_capabilities_and_plugins(mlxrt_client):
    status = mlxrt_client.get("/pages/status").json()
    model = status["model"]
    assert model["model_type"] == "qwen3" and model["context_window"] == 40960
    assert model["capabilities"] == {"reasoning": True, "tools": True, "vision": False, "structured_outputs": True,
                                     "embeddings": False, "chat_template": True}
    assert set(model["self_test"]) >= {"template", "tools"}
    plugins = {p["name"]: p for p in status["plugins"]}
    assert plugins["pages"]["status"] == "loaded" and plugins["pages"]["kind"] == "endpoint"
    assert "mlxrt_routes" in plugins["pages"]["hooks"]
    assert plugins["curve"]["kind"] == "sampler"


def test_status_lists_a_failed_plugin_with_its_error(mlxrt_tiny_checkpoint, mlxrt_serve):
    class Broken:
        @hookimpl
        def mlxrt_no_such_hook(self):
            return None

    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("broken", Broken())])
    plugins = {p["name"]: p for p in client.get("/pages/status").json()["plugins"]}
    assert plugins["broken"]["status"] == "failed"
    assert "mlxrt_no_such_hook" in plugins["broken"]["error"]
    assert client.get("/").status_code == 200  # the server serves on without it


def test_pages_are_public_but_the_json_is_behind_the_key(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"api_keys": ["sekret"]})
    assert client.get("/").status_code == 200
    assert client.get("/pages/assets/chat.js").status_code == 200
    assert client.get("/pages/status").status_code == 401
    assert client.post("/v1/curves/sample", json={"prompt": "x", "curve": SHARPEN}).status_code == 401
    ok = client.get("/pages/status", headers={"Authorization": "Bearer sekret"})
    assert ok.status_code == 200


def test_disabling_the_plugin_removes_the_pages(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), disable=["pages"])
    assert client.get("/").status_code == 404
    assert client.post("/v1/curves/sample", json={"prompt": "x", "curve": SHARPEN}).status_code == 404


# -- HTTP: the designer's endpoint --------------------------------------------------------------


def _sample(client, **body):
    resp = client.post("/v1/curves/sample", json={"prompt": "Once upon a time", **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_designer_samples_both_sides_with_the_same_seeds(mlxrt_client):
    out = _sample(mlxrt_client, curve=SHARPEN, n=4, max_tokens=6, seed=7, top=10)
    assert out["object"] == "curve.samples" and out["n"] == 4 and out["prompt_tokens"] > 3
    for side in ("curve", "recipe"):
        samples = out[side]["samples"]
        assert len(samples) == 4
        assert all(s["finish_reason"] in ("stop", "length") and 0 <= s["tokens"] <= 6 for s in samples)
    assert out["recipe"] == {**out["recipe"], "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
    # Reproducible: the same request gives the same texts (seed + i per sample).
    again = _sample(mlxrt_client, curve=SHARPEN, n=4, max_tokens=6, seed=7, top=10)
    assert [s["text"] for s in again["curve"]["samples"]] == [s["text"] for s in out["curve"]["samples"]]
    assert [s["text"] for s in again["recipe"]["samples"]] == [s["text"] for s in out["recipe"]["samples"]]
    # The plot is the transfer curve: through the knots, non-decreasing.
    plot = out["curve"]["plot"]
    ys = [p["y_pct"] for p in plot]
    assert ys == sorted(ys) and abs(plot[-1]["x_pct"] - 100) < 1e-9 and abs(plot[-1]["y_pct"] - 100) < 1e-6
    assert out["curve"]["points"][1] == {"x_pct": 1.0, "y_pct": 0.5}


def test_designer_distributions_follow_the_curve_and_the_recipe(mlxrt_client):
    # An identity curve and temperature 1 both leave the model's distribution as it is.
    same = _sample(mlxrt_client, curve=IDENTITY, n=0, top=15)
    assert same["curve"]["samples"] == [] and same["recipe"]["samples"] == []
    rows = same["distribution"]
    assert len(rows) >= 15
    assert [r["model"] for r in rows] == sorted((r["model"] for r in rows), reverse=True)
    for r in rows:
        assert r["curve"] == pytest.approx(r["model"], rel=1e-3, abs=1e-6)
        assert r["recipe"] == pytest.approx(r["model"], rel=1e-3, abs=1e-6)
    # Sharpening moves mass to the head: lower entropy than the model's, top token more likely.
    sharp = _sample(mlxrt_client, curve=SHARPEN, n=0, top=15, recipe={"temperature": 0})
    assert sharp["entropy_bits"]["curve"] < sharp["entropy_bits"]["model"]
    head = sharp["distribution"][0]
    assert head["curve"] > head["model"]
    # Temperature 0 is greedy: all the recipe's mass on the model's most likely token.
    assert head["recipe"] == 1.0 and sum(r["recipe"] for r in sharp["distribution"]) == 1.0
    # top_k 2 keeps two tokens.
    k2 = _sample(mlxrt_client, curve=SHARPEN, n=0, top=15, recipe={"temperature": 1, "top_k": 2})
    assert sum(r["recipe"] > 0 for r in k2["distribution"]) == 2
    # A top_k beyond the vocabulary keeps every token (and samples, rather than failing).
    wide = _sample(mlxrt_client, curve=SHARPEN, n=1, max_tokens=2, top=15, recipe={"top_k": 10**9})
    assert all(r["recipe"] == pytest.approx(r["model"], rel=1e-3, abs=1e-6) for r in wide["distribution"])


def test_designer_runs_on_the_engine_worker_beside_a_stream(counting_server, monkeypatch):
    """The designer's job runs on the engine thread (serialized with decode steps), while a
    batched stream is running, and the stream goes on afterwards."""
    from mlxrt.plugins.pages import designer

    threads = []
    real = designer.run_design
    monkeypatch.setattr(designer, "run_design", lambda loaded, req: threads.append(
        threading.current_thread().name) or real(loaded, req))
    with httpx.Client(base_url=counting_server.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "count"}], "stream": True, "max_tokens": 40}) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            assert json.loads(first[5:])["object"] == "chat.completion.chunk"
            out = client.post("/v1/curves/sample", json={"prompt": "hi", "curve": SHARPEN, "n": 2, "max_tokens": 3})
            assert out.status_code == 200, out.text
            rest = [line for line in lines if line.startswith("data:")]
    assert threads == ["mlxrt-engine"]
    assert rest[-1] == "data: [DONE]"
    finish = [json.loads(line[5:]) for line in rest[:-1]]
    assert any(c["choices"] and c["choices"][0]["finish_reason"] == "length" for c in finish)


@pytest.mark.parametrize(("body", "message"), [
    ({}, "prompt is required"),
    ({"prompt": "x"}, "curve is required"),
    ({"prompt": "x", "curve": 3}, "curve must be of type dict"),
    ({"prompt": "x", "curve": FALLING}, "curve is not monotone"),
    ({"prompt": "x", "curve": {"points": [{"x_pct": 1, "y_pct": 1}]}}, "curve.points must be an array of 2"),
    ({"prompt": "x", "curve": {"points": [{"x_pct": 101, "y_pct": 1}, {"x_pct": 2, "y_pct": 2}]}},
     "must be at most 100"),
    ({"prompt": "x", "curve": SHARPEN, "n": 33}, "n must be at most 32"),
    ({"prompt": "x", "curve": SHARPEN, "n": "3"}, "n must be of type int"),
    ({"prompt": "x", "curve": SHARPEN, "max_tokens": 0}, "max_tokens must be at least 1"),
    ({"prompt": "x", "curve": SHARPEN, "seed": -1}, "seed must be at least 0"),
    ({"prompt": "x", "curve": SHARPEN, "top": 0}, "top must be at least 1"),
    ({"prompt": "x", "curve": SHARPEN, "chat": "yes"}, "chat must be of type bool"),
    ({"prompt": "x", "curve": SHARPEN, "recipe": []}, "recipe must be of type dict"),
    ({"prompt": "x", "curve": SHARPEN, "recipe": {"temperature": -1}}, "recipe.temperature must be at least 0"),
    ({"prompt": "x", "curve": SHARPEN, "recipe": {"top_p": 2}}, "recipe.top_p must be at most 1"),
    ({"prompt": "x", "curve": SHARPEN, "recipe": {"top_k": 1.5}}, "recipe.top_k must be of type int"),
    ({"prompt": "x", "curve": SHARPEN, "recipe": {"temp": 1}}, "recipe has unknown field 'temp'"),
    ({"prompt": "x", "curve": SHARPEN, "stream": True}, "unknown field 'stream'"),
    ({"prompt": 5, "curve": SHARPEN}, "prompt must be of type str"),
])
def test_designer_rejects_bad_bodies_with_400(mlxrt_client, body, message):
    resp = mlxrt_client.post("/v1/curves/sample", json=body)
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"]["message"]
    assert _sample(mlxrt_client, curve=SHARPEN, n=1, max_tokens=2)["n"] == 1  # still serving


def test_designer_rejects_non_json_and_over_context(mlxrt_client):
    for raw in (b"[1, 2]", b"{", b"\xff"):
        resp = mlxrt_client.post("/v1/curves/sample", content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    long = mlxrt_client.post("/v1/curves/sample", json={"prompt": "word " * 41000, "chat": False, "curve": SHARPEN})
    assert long.status_code == 400 and "context" in long.json()["error"]["message"]


def test_designer_without_a_chat_template_needs_chat_false(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    src = mlxrt_tiny_checkpoint("qwen3")
    model = tmp_path / "no-template"
    shutil.copytree(src, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    for extra in model.glob("chat_template.*"):
        extra.unlink()
    client = mlxrt_serve(model)
    resp = client.post("/v1/curves/sample", json={"prompt": "x", "curve": SHARPEN})
    assert resp.status_code == 400 and "no chat template" in resp.json()["error"]["message"]
    assert _sample(client, curve=SHARPEN, chat=False, n=1)["prompt_tokens"] >= 1


# -- the browser ---------------------------------------------------------------------------------


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Python Playwright (pip install playwright)")
    with sync_api.sync_playwright() as pw:
        try:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except Exception as exc:  # a Chromium that cannot start here is a missing browser
            pytest.skip(f"Chromium did not start: {exc}")
        yield chromium
        chromium.close()


@pytest.fixture
def artifacts(tmp_path):
    folder = Path(os.environ.get("MLXRT_ARTIFACTS") or tmp_path) / "pages"
    folder.mkdir(parents=True, exist_ok=True)

    def shot(page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path

    return shot


def _page(browser, url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    return page, errors


def test_chat_page_streams_and_stops(browser, counting_server, artifacts):
    page, errors = _page(browser, counting_server.url + "/")
    # The status panel: model, capabilities, self-test, plugins, live engine stats.
    page.wait_for_selector("#model-facts dd")
    assert "qwen3" in page.inner_text("#model-facts")
    assert "reasoning" in page.inner_text("#capabilities")
    assert "pass" in page.inner_text("#self-test")
    assert "pages" in page.inner_text("#plugins") and "counting" in page.inner_text("#plugins")
    assert page.is_hidden("#attach-label")  # no image attach: this model has no vision
    page.wait_for_function("document.querySelector('#engine-facts').textContent.includes('prompt-cache hit rate')")

    # Send a message: text arrives while the request is still running (streamed), then finishes.
    page.click("#settings summary")
    page.fill("#max_tokens", "16")
    page.fill("#prompt", "Count for me")
    page.click("#send")
    page.wait_for_selector(".msg.user")
    page.wait_for_function("""() => {
        const c = document.querySelector('.msg.assistant .content');
        return c && c.textContent.length > 0 && document.querySelector('#send').disabled;
    }""", timeout=20000)
    page.wait_for_function("document.querySelector('.msg.assistant .meta').textContent.startsWith('finish: length')",
                           timeout=20000)
    text = page.inner_text(".msg.assistant .content")
    assert text.split()[:3] == ["one", "two", "three"], text
    assert not page.is_disabled("#send") and page.is_disabled("#stop")
    # Reasoning is folded away (none here) and the stats panel counts the request.
    assert page.is_hidden(".msg.assistant details.reasoning")
    page.wait_for_function("document.querySelector('#engine-facts').textContent.includes('requests served1')",
                           timeout=10000)
    artifacts(page, "chat-streamed")

    # A long answer, stopped from the page: the stream ends, the server counts a cancellation.
    page.fill("#max_tokens", "4000")
    page.fill("#prompt", "Count a lot")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('.msg.assistant')[1].querySelector('.content')"
                           ".textContent.split(' ').length > 4", timeout=20000)
    page.click("#stop")
    page.wait_for_function("document.querySelectorAll('.msg.assistant')[1].querySelector('.meta')"
                           ".textContent === 'finish: stopped'", timeout=10000)
    assert not page.is_disabled("#send")
    deadline = time.monotonic() + 10
    while httpx.get(counting_server.url + "/stats").json()["engine"]["requests_cancelled"] < 1:
        assert time.monotonic() < deadline, "the server never saw the stop"
        time.sleep(0.1)
    stopped = page.evaluate("document.querySelectorAll('.msg.assistant')[1].querySelector('.content').textContent")
    assert len(stopped.split()) < 4000
    artifacts(page, "chat-stopped")
    assert errors == []


def test_status_panel_asks_once_when_memory_is_off(browser, plain_server):
    """Memory plugin loaded, no --memory-dir: the page learns from one 404 that memory is off and
    stops asking (it polled /v1/memory/status every 2 s, a 404 in the server log each time)."""
    status = httpx.get(plain_server.url + "/pages/status").json()
    if not any(p["name"] == "memory" and p["status"] == "loaded" for p in status["plugins"]):
        pytest.skip("the mlxrt-memory plugin is not installed")
    asked = []
    page = browser.new_page()
    page.on("request", lambda r: asked.append(r.url) if "/v1/memory/status" in r.url else None)
    page.goto(plain_server.url + "/")
    page.wait_for_function("document.querySelector('#memory-state').textContent.includes('off')")
    stats_seen = page.evaluate("document.querySelector('#status-updated').textContent")
    page.wait_for_function(f"document.querySelector('#status-updated').textContent !== {json.dumps(stats_seen)}",
                           timeout=10000)  # /stats was polled again since: a memory poll would have followed
    time.sleep(2.5)
    assert len(asked) == 1, asked
    assert page.is_visible("#memory") and "--memory-dir" in page.inner_text("#memory-state")


def test_curve_designer_updates_plot_and_samples(browser, plain_server, artifacts):
    page, errors = _page(browser, plain_server.url + "/curves")
    # The first run: the plot drawn from the server's curve, the distribution, six samples a side.
    page.wait_for_selector("#curve-line")
    page.wait_for_function("document.querySelectorAll('#curve-samples li').length === 6"
                           " && document.querySelectorAll('#recipe-samples li').length === 6")
    assert page.locator("#dist-plot rect.bar-curve").count() >= 1
    assert "entropy" in page.inner_text("#entropy")
    before = page.get_attribute("#curve-line", "d")
    artifacts(page, "curves-initial")

    # Change a parameter (the middle point's output): the plot redraws, new samples appear.
    page.evaluate("document.querySelectorAll('#curve-samples li').forEach(li => li.remove())")
    page.fill("#points tr.point:nth-child(2) .y", "5")
    page.wait_for_function("(d) => { const l = document.querySelector('#curve-line'); return l && l.getAttribute('d') !== d; }",
                           arg=before)
    page.wait_for_function("document.querySelectorAll('#curve-samples li').length === 6")
    page.fill("#n", "3")
    page.wait_for_function("document.querySelectorAll('#recipe-samples li').length === 3")
    artifacts(page, "curves-changed")

    # A falling segment: the server's reason is shown, the knots turn red, the line goes.
    page.fill("#points tr.point:nth-child(3) .y", "0.01")
    page.wait_for_function("document.querySelector('#curve-reason').textContent.includes('not monotone')")
    reason = page.inner_text("#curve-reason")
    assert "falls" in reason and "x_pct=1" in reason
    assert page.locator("#curve-plot circle.knot.bad").count() == 4
    assert page.locator("#curve-line").count() == 0
    assert "stale" in page.get_attribute("#results", "class")  # the last valid results, dimmed
    artifacts(page, "curves-non-monotone")

    # Fixed again: the server still answers, the reason clears.
    page.fill("#points tr.point:nth-child(3) .y", "25")
    page.wait_for_selector("#curve-line")
    page.wait_for_function("document.querySelector('#curve-reason').textContent === ''")
    assert "stale" not in page.get_attribute("#results", "class")

    # Dragging a knot up edits its point and redraws the curve.
    before = page.get_attribute("#curve-line", "d")
    box = page.locator('#curve-plot circle.knot[data-index="2"]').bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x, y - 30, steps=5)
    page.mouse.up()
    page.wait_for_function("(d) => { const l = document.querySelector('#curve-line'); return l && l.getAttribute('d') !== d; }",
                           arg=before)
    assert float(page.input_value("#points tr.point:nth-child(3) .y")) > 25
    artifacts(page, "curves-dragged")
    assert errors == []


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_chat_page_folds_reasoning_and_shows_tool_cards(browser, script_server, artifacts):
    page, errors = _page(browser, script_server.url + "/")
    page.click("#settings summary")
    page.fill("#system", "You are terse.")
    page.fill("#tools", "[not json")
    page.fill("#prompt", "Weather in Paris?")
    page.click("#send")
    page.wait_for_function("document.querySelector('.msg.assistant .meta').textContent.includes('not valid JSON')")
    page.fill("#tools", json.dumps(TOOLS))
    page.fill("#prompt", "Weather in Paris?")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('.msg.assistant')[1].querySelector('.meta')"
                           ".textContent.startsWith('finish: tool_calls')", timeout=20000)
    answer = page.locator(".msg.assistant").nth(1)
    reasoning = answer.locator("details.reasoning")
    assert reasoning.is_visible() and reasoning.get_attribute("open") is None  # collapsed
    assert "let me think" in reasoning.locator(".reasoning-text").text_content()
    assert "let me think" not in answer.locator(".content").text_content()
    card = answer.locator(".tool-card")
    assert card.count() == 1
    assert card.locator(".name").inner_text() == "get_weather"
    assert json.loads(card.locator(".args").inner_text()) == {"city": "Paris"}
    artifacts(page, "chat-reasoning-tools")
    assert errors == []


def test_chat_page_attaches_an_image_when_the_model_has_vision(browser, mlxrt_tiny_checkpoint, tmp_path, artifacts):
    import base64

    png = tmp_path / "dot.png"
    png.write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="))
    from mlxrt.testing import write_tiny_checkpoint

    server = LiveServer(write_tiny_checkpoint(tmp_path / "gemma4", "gemma4"))  # a tiny tower: real vision
    try:
        page, errors = _page(browser, server.url + "/")
        page.wait_for_selector("#attach-label:not([hidden])")
        page.set_input_files("#attach", str(png))
        page.wait_for_function("chat.image !== null")
        page.fill("#prompt", "What is this?")
        with page.expect_request("**/v1/chat/completions") as sent:
            page.click("#send")
        parts = json.loads(sent.value.post_data)["messages"][-1]["content"]
        assert parts[0] == {"type": "text", "text": "What is this?"}
        assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
        assert page.locator(".msg.user img").count() == 1
        # The image goes through the model's tower: the turn finishes with an answer, no error.
        page.wait_for_function("document.querySelector('.msg.assistant .meta').textContent.startsWith('finish:')",
                               timeout=30000)
        assert page.inner_text(".msg.assistant .content").strip()
        artifacts(page, "chat-image")
        assert errors == []
    finally:
        server.stop()


def test_schema_page_and_favicon_are_served_offline(mlxrt_client):
    """/schema is Swagger UI whose every file comes from this server (it was Redoc with fonts
    and an image from three CDNs: blank offline); /favicon.ico answers (it was a 404 on every
    page load). Over plain HTTP, where no browser is needed."""
    import re

    page = mlxrt_client.get("/schema")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    linked = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert linked and all(url.startswith("/") and not url.startswith("//") for url in linked), linked
    assert not re.search(r"https?://", page.text)
    for url in linked:
        asset = mlxrt_client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 200, url
    icon = mlxrt_client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert mlxrt_client.get("/schema/assets/secrets.txt").status_code == 404
    assert mlxrt_client.get("/schema/redoc").status_code == 404  # Litestar's CDN pages are not served
    for document in ("/schema/openapi.json", "/schema/openapi.yaml", "/schema/openapi.yml"):
        assert mlxrt_client.get(document).status_code == 200, document


def test_schema_page_renders_with_no_request_off_the_server(browser, plain_server):
    page = browser.new_page()
    elsewhere = []
    page.on("request", lambda r: None if r.url.startswith(plain_server.url) else elsewhere.append(r.url))
    page.goto(plain_server.url + "/schema")
    page.wait_for_selector(".swagger-ui .info .title", timeout=20000)
    assert "mlxrt" in page.inner_text(".swagger-ui .info .title")
    assert page.locator(".opblock").count() > 10  # the operations are listed
    assert elsewhere == []


def test_the_browser_connects_to_nothing_but_the_server(plain_server, tmp_path):
    """Chromium's own network log, over a page load and a few idle seconds: every TCP connection
    goes to the loopback server (with the old flags it looked up and opened Google hosts)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Python Playwright (pip install playwright)")
    netlog = tmp_path / "net.json"
    with sync_api.sync_playwright() as pw:
        try:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=[*CHROMIUM_ARGS, f"--log-net-log={netlog}"])
        except Exception as exc:
            pytest.skip(f"Chromium did not start: {exc}")
        page = chromium.new_page()
        page.goto(plain_server.url + "/")
        page.wait_for_selector("#model-facts dd")
        time.sleep(4)  # the background services start within seconds
        chromium.close()
    log = json.loads(netlog.read_text())
    names = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    kinds = {names.get(e["type"]) for e in log["events"]}
    connects = {e["params"]["address"] for e in log["events"]
                if names.get(e["type"]) == "TCP_CONNECT_ATTEMPT" and "address" in (e.get("params") or {})}
    assert connects and all(a.startswith("127.0.0.1:") for a in connects), connects
    # Not a name looked up either: without the host rules it sent ~60 DNS queries for Google hosts.
    assert "DNS_TRANSACTION" not in kinds and "UDP_BYTES_SENT" not in kinds
