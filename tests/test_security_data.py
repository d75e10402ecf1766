"""Security and fault isolation, the data and engine side (issue 22): nothing of one request
shows in another's view of the server, stored responses belong to their creator, the image
fetcher cannot be pointed at the server's own network, adapters mount only from the operator's
folders, and one request's bad numbers or failing plugin never end the others."""

from __future__ import annotations

import json
import re

import openai
import pytest
from support import Exploding, free_port, openai_client

SECRET = "the vault code is zebra-4471, tell nobody"


def _client(http, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key=key, http_client=http, max_retries=0)


# -- item 1: /stats and stored responses ------------------------------------------------------

@pytest.fixture
def keyed(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"api_keys": ["key-alice", "key-bob"]})


def test_stats_and_metrics_show_no_prompt_text_and_no_ids_of_other_requests(keyed):
    alice = _client(keyed, "key-alice")
    created = alice.responses.create(model="m", input=SECRET, max_output_tokens=4, temperature=0)
    # Alice's second prompt shares a prefix with her first, so the prompt cache reports a partial
    # miss (in her own partition: Bob's prompts never meet hers, tests/test_security_bounds.py).
    alice.responses.create(model="m", input="the vault code is", max_output_tokens=4, temperature=0)
    headers = {"authorization": "Bearer key-bob"}
    stats = keyed.get("/stats", headers=headers)
    metrics = keyed.get("/metrics", headers=headers)
    assert stats.status_code == 200 and metrics.status_code == 200
    last_miss = stats.json()["engine"]["prompt_cache"]["last_miss"]
    assert last_miss is not None
    assert set(last_miss) == {"status", "diverged_at", "prompt_tokens", "cached_tokens", "reason"}
    # the reason is one of a fixed few words, never text from a prompt
    assert last_miss["reason"] in ("prompt diverged", "sliding window", "recurrent state", "no cached prompt")
    for text in (stats.text, metrics.text):
        assert created.id not in text
        assert "zebra" not in text and "vault" not in text and "resp_" not in text


def test_a_stored_response_is_bound_to_the_key_that_created_it(keyed):
    alice, bob = _client(keyed, "key-alice"), _client(keyed, "key-bob")
    created = alice.responses.create(model="m", input=SECRET, max_output_tokens=4, temperature=0)
    assert re.fullmatch(r"resp_[0-9a-f]{48}", created.id)  # 192 random bits
    # Bob holds the id (say it leaked) but not the key: the response does not exist for him.
    with pytest.raises(openai.NotFoundError) as missing:
        bob.responses.retrieve(created.id)
    never = "resp_" + "0" * 48
    with pytest.raises(openai.NotFoundError) as absent:
        bob.responses.retrieve(never)
    assert missing.value.body["message"].replace(created.id, "ID") == absent.value.body["message"].replace(never, "ID")
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="m", input="go on", previous_response_id=created.id, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(created.id)
    # ...and it is untouched for Alice.
    assert alice.responses.retrieve(created.id).id == created.id
    follow = alice.responses.create(model="m", input="go on", previous_response_id=created.id,
                                    max_output_tokens=2, temperature=0)
    assert follow.previous_response_id == created.id
    alice.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(created.id)
    # A streamed response is stored under its creator's key too.
    events = list(alice.responses.create(model="m", input=SECRET, max_output_tokens=3, temperature=0, stream=True))
    streamed = events[-1].response.id
    assert alice.responses.retrieve(streamed).id == streamed
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(streamed)


def test_without_a_key_the_unguessable_id_is_the_only_handle(mlxrt_client):
    client = openai_client(mlxrt_client)
    ids = {client.responses.create(model="m", input="hi", max_output_tokens=1).id for _ in range(3)}
    assert len(ids) == 3 and all(re.fullmatch(r"resp_[0-9a-f]{48}", i) for i in ids)
    some = next(iter(ids))
    assert client.responses.retrieve(some).id == some
    assert some not in mlxrt_client.get("/stats").text
    near = some[:-1] + ("1" if some[-1] == "0" else "0")
    assert mlxrt_client.get(f"/v1/responses/{near}").status_code == 404  # a near miss finds nothing
    assert json.loads(mlxrt_client.get("/stats").text)["responses"]["entries"] == 3


# -- item 3: the image fetcher's SSRF guard ---------------------------------------------------

def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4), (10, 20, 30)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def web():
    """Two loopback HTTP servers: ``victim`` records every request it gets (the guard must keep
    it unreached); ``site`` serves /img.png and answers /go?to=URL with a 302 to URL."""
    import http.server
    import threading
    import urllib.parse

    body = _png()
    hits: list[str] = []
    hosts: list[str] = []

    class Victim(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            hits.append(self.path)
            hosts.append(self.headers.get("Host"))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Site(Victim):
        def do_GET(self):
            if self.path.startswith("/go?to="):
                self.send_response(302)
                self.send_header("Location", urllib.parse.unquote(self.path[len("/go?to="):]))
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (Victim, Site)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"victim": servers[0].server_address[1], "site": servers[1].server_address[1], "hits": hits,
           "hosts": hosts}
    for server in servers:
        server.shutdown()


#: Spellings of this machine's own addresses; each is percent-encoded at random below.
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "LocalHost", "127.1", "0x7f.0.0.1", "0177.0.0.1", "2130706433",
                  "127.0.0.2", "0.0.0.0", "[::1]", "[::ffff:127.0.0.1]", "[0:0:0:0:0:0:0:1]",
                  "\u24dbocalhost", "\uff11\uff12\uff17.\uff10.\uff10.\uff11"]


def _encodings():
    from hypothesis import strategies as st

    def encode(host: str, mask: list[bool], upper: bool) -> str:
        out = []
        for ch, enc in zip(host, mask + [False] * len(host), strict=False):
            if enc:
                hexed = "".join(f"%{b:02X}" if upper else f"%{b:02x}" for b in ch.encode())
                out.append(hexed)
            else:
                out.append(ch)
        return "".join(out)

    return st.builds(encode, st.sampled_from(LOOPBACK_HOSTS), st.lists(st.booleans(), max_size=20), st.booleans())


def _load(url: str, **limits):
    from mlxrt.loading.images import ImageLimits, ImageRef, load_image

    return load_image(ImageRef(where="messages[0].content[1]", url=url), ImageLimits(fetch_timeout=2.0, **limits))


@pytest.mark.parametrize("host", ["%31%32%37.0.0.1", "127.0.0.%31", "localhos%74", "%5B::1%5D", "127.1",
                                  "2130706433", "[::ffff:127.0.0.1]", "\u24dbocalhost"])
def test_the_reported_encoded_loopback_urls_are_refused_by_name(web, host):
    from mlxrt.errors import InvalidRequest

    before = len(web["hits"])
    with pytest.raises(InvalidRequest, match="is a private or loopback address"):
        _load(f"http://{host}:{web['victim']}/x.png")
    assert len(web["hits"]) == before


def test_no_encoding_of_a_loopback_host_reaches_the_server(web):
    from hypothesis import HealthCheck, given, settings

    from mlxrt.errors import InvalidRequest

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(host=_encodings())
    def check(host):
        with pytest.raises(InvalidRequest) as err:
            _load(f"http://{host}:{web['victim']}/x.png")
        assert err.value.status == 400
        assert web["hits"] == []

    web["hits"].clear()
    check()


def test_redirects_to_encoded_loopback_hosts_are_checked_on_every_hop(web, monkeypatch):
    import urllib.parse

    from hypothesis import HealthCheck, given, settings

    import mlxrt.loading.images as images
    from mlxrt.errors import InvalidRequest

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(host=_encodings(), depth=st_depth())
    def check(host, depth):
        # The first hop passes (pretend the site's address is public); no later hop may.
        checked: list[str] = []
        monkeypatch.setattr(images, "_public", lambda address: checked.append(str(address)) or len(checked) == 1)
        url = f"http://{host}:{web['victim']}/x.png"
        for _ in range(depth):  # a chain of redirects through the site before the bad hop
            url = f"http://127.0.0.1:{web['site']}/go?to={urllib.parse.quote(url, safe='')}"
        with pytest.raises(InvalidRequest):
            _load(url)
        assert web["hits"] == []

    web["hits"].clear()
    check()


def st_depth():
    from hypothesis import strategies as st

    return st.integers(min_value=1, max_value=3)


def test_redirect_chains_are_capped(web):
    import urllib.parse

    from mlxrt.errors import InvalidRequest
    from mlxrt.loading.images import MAX_REDIRECTS

    url = f"http://127.0.0.1:{web['site']}/img.png"
    for _ in range(MAX_REDIRECTS):
        url = f"http://127.0.0.1:{web['site']}/go?to={urllib.parse.quote(url, safe='')}"
    assert _load(url, allow_private=True).size == (4, 4)  # MAX_REDIRECTS hops are followed
    url = f"http://127.0.0.1:{web['site']}/go?to={urllib.parse.quote(url, safe='')}"
    with pytest.raises(InvalidRequest, match=f"more than {MAX_REDIRECTS} redirects"):
        _load(url, allow_private=True)


def test_allow_private_image_urls_still_fetches_and_redirects(web):
    import urllib.parse

    web["hits"].clear()
    direct = f"http://127.0.0.1:{web['victim']}/ok.png"
    assert _load(direct, allow_private=True).size == (4, 4)
    encoded = f"http://%31%32%37.0.0.1:{web['victim']}/enc.png"  # unquoted once, like any client
    assert _load(encoded, allow_private=True).size == (4, 4)
    target = urllib.parse.quote(f"http://localhost:{web['victim']}/hop.png", safe="")
    hop = f"http://127.0.0.1:{web['site']}/go?to={target}"
    assert _load(hop, allow_private=True).size == (4, 4)
    assert web["hits"] == ["/ok.png", "/enc.png", "/hop.png"]
    # Connected by the checked address, named as the URL names the host.
    port = web["victim"]
    assert web["hosts"][-3:] == [f"127.0.0.1:{port}", f"127.0.0.1:{port}", f"localhost:{port}"]


def test_the_connection_goes_to_the_address_that_was_checked(monkeypatch):
    """DNS rebinding: the host is resolved once and that address is connected to; a second
    answer (a private one) is never asked for."""
    import socket

    import mlxrt.loading.images as images
    from mlxrt.errors import InvalidRequest

    answers = iter(["93.184.215.14", "127.0.0.1"])
    lookups: list[str] = []
    connected: list[tuple] = []

    def getaddrinfo(host, port, *args, **kw):
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    def create_connection(address, *args, **kw):
        connected.append(address)
        raise ConnectionRefusedError

    monkeypatch.setattr(images.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(images.socket, "create_connection", create_connection)
    with pytest.raises(InvalidRequest, match="image could not be fetched$"):
        _load("http://rebind.example/x.png")
    assert lookups == ["rebind.example"] and connected == [("93.184.215.14", 80)]


def test_network_failures_do_not_tell_open_from_closed_ports():
    import socket

    from mlxrt.errors import InvalidRequest

    silent = socket.socket()  # listens, never answers: a filtered / hanging port
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    texts = set()
    try:
        for port in (free_port(), silent.getsockname()[1]):
            with pytest.raises(InvalidRequest) as err:
                _load(f"http://127.0.0.1:{port}/x.png", allow_private=True)
            texts.add(err.value.message)
        with pytest.raises(InvalidRequest) as err:
            _load("http://no-such-host.invalid/x.png", allow_private=True)
        texts.add(err.value.message)
    finally:
        silent.close()
    assert texts == {"messages[0].content[1]: image could not be fetched"}


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:80\\@evil.invalid/x.png", "credentials"),
    ("http://user:pw@example.com/x.png", "credentials"),
    ("http://exa%40mple.com/x.png", "credentials"),
    ("http://example.com\\x.png", "malformed"),
    ("http://exa%2525mple.com/x.png", "malformed"),
    ("http://example.com:0/x.png", "malformed"),
    ("http://example.com:99999/x.png", "malformed"),
    ("http://example.com:http/x.png", "malformed"),
    ("http://exa mple.com/x.png", "malformed"),
    ("http://exa%00mple.com/x.png", "malformed"),
    ("http://%ff%fe/x.png", "malformed"),
    ("http://%5B::1/x.png", "malformed"),
    ("http://[::1/x.png", "malformed"),
])
def test_odd_urls_are_400s_before_any_lookup(url, why, monkeypatch):
    import mlxrt.loading.images as images
    from mlxrt.errors import InvalidRequest

    monkeypatch.setattr(images.socket, "getaddrinfo", lambda *a, **k: pytest.fail("resolved a refused URL"))
    with pytest.raises(InvalidRequest, match=why) as err:
        _load(url)
    assert err.value.status == 400


# -- item 4: one request never ends another ---------------------------------------------------


PROMPTS = ["tell me about the sea", "one two three four", "the weather in Paris", "a story about a cat"]


@pytest.fixture(scope="module")
def batch4(mlxrt_tiny_checkpoint, tmp_path_factory):
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    host = make_host(extra=[("exploding", Exploding())])
    app = build_server(host, str(mlxrt_tiny_checkpoint("qwen3")), {"host": "127.0.0.1", "port": 0, "batch": 4,
                                                           "prompt_cache_size": 0, "model_fallback": True})
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a Host the loopback server serves
        yield client
    app.state.models.stop()


def _complete(client, prompt, **kw):
    return openai_client(client).completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0,
                                                    **kw).choices[0].text


def test_a_processor_raising_mid_decode_fails_only_its_own_row(batch4):
    import concurrent.futures as cf

    alone = [_complete(batch4, p) for p in PROMPTS[1:]]
    served = batch4.get("/stats").json()["engine"]["served_by_lane"]["batch"]

    def run(i):
        try:
            return _complete(batch4, PROMPTS[i], **({"extra_body": {"explode": 3}} if i == 0 else {}))
        except openai.APIStatusError as exc:
            return exc

    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(4)))
    failed, rest = results[0], results[1:]
    assert isinstance(failed, openai.InternalServerError), failed
    assert "processor exploded for 3" in str(failed.body)
    assert rest == alone  # the other rows went on, unchanged, and saw no error
    assert batch4.get("/stats").json()["engine"]["served_by_lane"]["batch"] == served + 4
    assert _complete(batch4, PROMPTS[1]) == alone[0]  # and the lane keeps serving


def test_in_the_serial_lane_a_raising_processor_fails_its_request_and_the_server_goes_on(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("exploding", Exploding())], options={"prompt_cache_size": 0})
    alone = _complete(client, PROMPTS[1])
    with pytest.raises(openai.InternalServerError, match="processor exploded for 2"):
        _complete(client, PROMPTS[0], extra_body={"explode": 2})
    assert _complete(client, PROMPTS[1]) == alone


@pytest.mark.parametrize("field", ["presence_context_size", "frequency_context_size", "repetition_context_size",
                                   "top_k"])
@pytest.mark.parametrize("value", [2**31, 2**63, -1])
def test_sizes_mlx_cannot_slice_with_are_400s_naming_the_field(batch4, field, value):
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        resp = batch4.post(path, json={**body, "max_tokens": 2, field: value, "presence_penalty": 0.5})
        assert resp.status_code == 400, resp.text
        assert field in resp.json()["error"]["message"]
    assert _complete(batch4, "hi", extra_body={field: 2**31 - 1}) is not None  # the largest allowed


NUMERIC = ["temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "repetition_context_size",
           "presence_penalty", "presence_context_size", "frequency_penalty", "frequency_context_size",
           "xtc_probability", "xtc_threshold", "max_tokens", "top_logprobs", "n"]


def test_numeric_fields_fuzzed_give_200_or_400_and_never_end_other_requests(batch4):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    numbers = st.one_of(st.integers(min_value=-2**70, max_value=2**70),
                        st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**63, 2**64, -2**31 - 1]),
                        st.floats(allow_nan=False, allow_infinity=False, width=64))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(fields=st.dictionaries(st.sampled_from(NUMERIC), numbers, min_size=1, max_size=3))
    def check(fields):
        body = {"prompt": "hi", "max_tokens": 2, **fields}
        if "max_tokens" in fields and isinstance(fields["max_tokens"], int) and fields["max_tokens"] > 0:
            body["max_tokens"] = min(fields["max_tokens"], 3)
        resp = batch4.post("/v1/completions", json=body)
        assert resp.status_code in (200, 400), (fields, resp.status_code, resp.text)

    check()
    assert _complete(batch4, PROMPTS[1]) == _complete(batch4, PROMPTS[1])


# -- adapters mount only from the operator's folders -----------------------------------------

@pytest.fixture(scope="module")
def adapter_roots(mlxrt_tiny_checkpoint, tmp_path_factory):
    from mlxrt.testing import write_random_adapter

    model = mlxrt_tiny_checkpoint("qwen3")
    root = tmp_path_factory.mktemp("roots")
    inside = write_random_adapter(root / "allowed" / "good", model, seed=1, rank=2)
    outside = write_random_adapter(root / "elsewhere" / "real", model, seed=2, rank=2)
    (root / "allowed" / "escape").symlink_to(outside)  # a link inside that points outside
    (root / "allowed" / "inner").symlink_to(inside)  # a link inside that stays inside
    return {"model": model, "root": root / "allowed", "inside": inside, "outside": outside}


def test_mounting_is_confined_to_the_adapter_dirs(adapter_roots, mlxrt_serve):
    r = adapter_roots
    client = mlxrt_serve(r["model"], options={"adapter_dir": (str(r["root"]),)})

    def mount(path, id="x"):
        return client.post("/v1/adapters", json={"id": id, "path": path})

    refused = [mount(str(r["outside"])), mount(str(r["outside"].parent / "missing")), mount("/etc"),
               mount(str(r["root"] / "escape")), mount(str(r["root"] / ".." / "elsewhere" / "real")),
               mount("/nonexistent/deeper/path")]
    assert {resp.status_code for resp in refused} == {400}
    bodies = {json.dumps(resp.json(), sort_keys=True) for resp in refused}
    assert len(bodies) == 1  # one text: existing and missing paths outside the roots look alike
    assert "adapter_path_not_allowed" in bodies.pop()
    nul = mount(str(r["inside"]) + "\x00/etc")
    assert nul.status_code == 400 and "NUL" in nul.json()["error"]["message"]
    assert mount(str(r["inside"]), "good").status_code == 200
    assert client.delete("/v1/adapters/good").status_code == 200  # a folder mounts once (issue 31)
    assert mount(str(r["root"] / "inner"), "inner").status_code == 200  # a link resolving inside is fine
    assert client.get("/health").status_code == 200


def test_without_an_adapter_dir_mounting_by_path_is_refused(adapter_roots, mlxrt_serve):
    client = mlxrt_serve(adapter_roots["model"])
    resp = client.post("/v1/adapters", json={"id": "x", "path": str(adapter_roots["inside"])})
    assert resp.status_code == 400 and "--adapter-dir" in resp.json()["error"]["message"]


# -- item 5 (images): a count cap and a pixel budget per request ------------------------------

def _data_url(size=(100, 100)) -> str:
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_image_count_is_capped_before_anything_is_fetched(web):
    from mlxrt.errors import InvalidRequest
    from mlxrt.loading.images import ImageLimits, ImageRef, load_images

    web["hits"].clear()
    refs = [ImageRef(where=f"messages[0].content[{i}]", url=f"http://127.0.0.1:{web['victim']}/{i}.png")
            for i in range(5)]
    with pytest.raises(InvalidRequest, match=r"content\[4\]: the request has 5 images, over the limit of 4 "
                                             r"per request \(--max-images\)"):
        load_images(refs, ImageLimits(allow_private=True, max_images=4))
    assert web["hits"] == []
    assert len(load_images(refs[:4], ImageLimits(allow_private=True, max_images=4))) == 4


def test_decoded_pixels_of_a_request_are_budgeted():
    from mlxrt.errors import InvalidRequest
    from mlxrt.loading.images import ImageLimits, ImageRef, load_images

    refs = [ImageRef(where=f"messages[0].content[{i}]", url=_data_url()) for i in range(3)]
    assert len(load_images(refs, ImageLimits(max_total_pixels=30_000))) == 3
    with pytest.raises(InvalidRequest, match=r"content\[2\]: the request's images exceed the 25000-pixel budget"):
        load_images(refs, ImageLimits(max_total_pixels=25_000))


def test_image_caps_and_odd_urls_through_the_server(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("gemma4"), options={"max_images": 2, "max_image_pixels": 25_000}))

    def chat(*urls):
        parts = [{"type": "text", "text": "describe"}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        return client.chat.completions.create(model="m", max_tokens=2, temperature=0,
                                              messages=[{"role": "user", "content": parts}])

    for urls, why in (((_data_url(),) * 3, "over the limit of 2 per request (--max-images)"),
                      ((_data_url(), _data_url((100, 200))), "25000-pixel budget per request"),
                      (("http://127.0.0.1:1\\@evil.invalid/x.png",), "credentials"),
                      (("http://%31%32%37.0.0.1:1/x.png",), "private or loopback")):
        with pytest.raises(openai.BadRequestError) as err:
            chat(*urls)
        assert why in str(err.value.body), err.value.body
    assert chat(_data_url(), _data_url()).choices[0].finish_reason  # within the caps: served


def test_any_url_text_is_a_400_never_a_crash(monkeypatch):
    import socket

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import mlxrt.loading.images as images
    from mlxrt.errors import InvalidRequest

    # Every name resolves to loopback here: nothing is fetched, every URL ends in a 400.
    monkeypatch.setattr(images.socket, "getaddrinfo", lambda host, port, *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))])

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(rest=st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
           scheme=st.sampled_from(["http://", "https://", "HTTP://", "http:/", "http:"]))
    def check(scheme, rest):
        with pytest.raises(InvalidRequest) as err:
            _load(scheme + rest)
        assert err.value.status == 400

    check()
