"""Isolation between callers and bounded resources, the data side (issue 31): IPv6 spellings of
private IPv4 addresses, per-caller stores, adapters that belong to their key, the server's own
origins, threads that loads give back."""

from __future__ import annotations

import ipaddress

import pytest

# -- finding 14: IPv6 forms that embed an IPv4 address ---------------------------------------


def _load(url: str):
    from mlxrt.loading.images import ImageLimits, ImageRef, load_image

    return load_image(ImageRef(where="messages[0].content[1]", url=url), ImageLimits(fetch_timeout=2.0))


@pytest.mark.parametrize("host", ["64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b:1::7f00:1", "2002:7f00:1::",
                                  "2002:c0a8:101::1", "::7f00:1", "::ffff:127.0.0.1", "::ffff:0:7f00:1",
                                  "::ffff:10.0.0.1", "64:ff9b::a9fe:a9fe"])
def test_ipv6_forms_embedding_a_private_ipv4_address_are_refused(host):
    from mlxrt.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="is a private or loopback address"):
        _load(f"http://[{host}]:9/x.png")


@pytest.mark.parametrize("address, public", [("64:ff9b::808:808", True), ("2002:808:808::1", True),
                                             ("::ffff:8.8.8.8", True), ("2606:4700::1111", True),
                                             ("64:ff9b::7f00:1", False), ("2002:a9fe:a9fe::", False),
                                             ("::1", False), ("::", False)])
def test_embedded_ipv4_addresses_are_judged_as_ipv4(address, public):
    from mlxrt.loading.images import _public

    assert _public(ipaddress.ip_address(address)) is public


# -- finding 16: the server's own pages under every loopback name ----------------------------


def test_own_pages_under_any_loopback_name_may_change_state(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"port": 8123})
    for origin in ("http://localhost:8123", "http://127.0.0.1:8123", "http://[::1]:8123", "http://LOCALHOST:8123/"):
        resp = client.delete("/v1/adapters/x", headers={"origin": origin})
        assert resp.status_code == 404, (origin, resp.text)  # through the edge: not mounted
    for origin in ("http://localhost:8124", "http://localhost", "https://localhost:8123", "http://evil.test:8123",
                   "http://localhost.evil.test:8123", "null"):
        resp = client.delete("/v1/adapters/x", headers={"origin": origin})
        assert resp.status_code == 403, origin
        assert resp.json()["error"]["code"] == "cross_origin_refused"


def test_loopback_names_are_not_own_origins_off_loopback(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"host": "0.0.0.0", "port": 8123})
    assert client.delete("/v1/adapters/x", headers={"origin": "http://localhost:8123"}).status_code == 403
    assert client.delete("/v1/adapters/x", headers={"origin": "http://127.0.0.1"}).status_code == 404  # Host's own


# -- finding 11: the response store's byte cap is each caller's ------------------------------


def test_one_keys_stored_responses_are_never_evicted_by_another_keys_traffic(mlxrt_tiny_checkpoint, mlxrt_serve):
    import openai

    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"api_keys": ["key-a", "key-b"], "response_store_bytes": 1})
    sdk = {k: openai.OpenAI(base_url=f"{client.base_url}/v1", api_key=k, http_client=client, max_retries=0)
           for k in ("key-a", "key-b")}
    kept = sdk["key-a"].responses.create(model="m", input="remember this", max_output_tokens=4)
    flood = [sdk["key-b"].responses.create(model="m", input=f"flood {i}", max_output_tokens=4) for i in range(3)]
    assert sdk["key-a"].responses.retrieve(kept.id).id == kept.id  # key B's traffic evicted nothing of A's
    assert sdk["key-b"].responses.retrieve(flood[-1].id).id == flood[-1].id
    for old in flood[:-1]:  # B's own cap (1 byte: its latest entry only) evicts B's own entries
        with pytest.raises(openai.NotFoundError):
            sdk["key-b"].responses.retrieve(old.id)
    assert client.get("/stats", headers={"Authorization": "Bearer key-a"}).json()["responses"]["evicted"] == 2


# -- finding 15: adapters stay under their roots, mount once, and belong to their key --------


@pytest.fixture
def adapter_roots(mlxrt_tiny_checkpoint, tmp_path):
    from mlxrt.testing import write_random_adapter

    model = mlxrt_tiny_checkpoint("qwen3")
    root = tmp_path / "adapters"
    write_random_adapter(root / "a", model, seed=1, rank=2)
    outside = write_random_adapter(tmp_path / "outside" / "evil", model, seed=2, rank=2)
    (root / "link").symlink_to(outside, target_is_directory=True)
    return {"model": model, "root": root, "a": root / "a"}


def test_a_symlink_out_of_the_root_is_not_listed_and_a_folder_mounts_once(adapter_roots, mlxrt_serve):
    client = mlxrt_serve(adapter_roots["model"], options={"adapter_dir": (str(adapter_roots["root"]),)})
    listed = client.get("/v1/adapters/available").json()["adapters"]
    assert [row["id"] for row in listed] == ["a"] and "outside" not in str(listed)
    assert client.post("/v1/adapters", json={"id": "a", "path": str(adapter_roots["a"])}).status_code == 200
    again = client.post("/v1/adapters", json={"id": "a-again", "path": str(adapter_roots["a"])})
    assert again.status_code == 400 and again.json()["error"]["code"] == "adapter_exists"
    assert 'already mounted as "a"' in again.json()["error"]["message"]
    assert [a["id"] for a in client.get("/v1/adapters").json()["adapters"]] == ["a"]


def test_an_adapter_belongs_to_the_key_that_mounted_it(adapter_roots, mlxrt_serve):
    import hashlib

    client = mlxrt_serve(adapter_roots["model"], options={"adapter_dir": (str(adapter_roots["root"]),),
                                                        "api_keys": ["key-a", "key-b"]})
    a, b = ({"Authorization": f"Bearer {k}"} for k in ("key-a", "key-b"))

    def complete(headers, adapter):
        return client.post("/v1/completions", headers=headers, json={"prompt": "hi", "max_tokens": 3,
                                                                     "temperature": 0, "adapter": adapter})

    mount = {"id": "mine", "path": str(adapter_roots["a"])}
    assert client.post("/v1/adapters", headers=a, json=mount).status_code == 200
    assert complete(a, "mine").status_code == 200
    used = complete(b, "mine")
    assert used.status_code == 400 and used.json()["error"]["code"] == "unknown_adapter"
    assert "mine" not in used.json()["error"]["message"].partition("mounted:")[2]
    prefixed = hashlib.sha256(b"key-a").hexdigest()[:16] + "/mine"
    assert complete(b, prefixed).status_code == 400
    assert client.get("/v1/adapters", headers=b).json()["adapters"] == []
    assert client.get("/v1/adapters/available", headers=b).json()["adapters"][0]["mounted"] is None
    assert client.get("/v1/adapters/available", headers=a).json()["adapters"][0]["mounted"] == "mine"
    assert client.delete("/v1/adapters/mine", headers=b).status_code == 404
    assert "mine" not in client.get("/stats", headers=b).json()["engine"]["adapters"]["mounted"]
    # B's own mount of the same folder and id is B's: unmounting it leaves A's.
    assert client.post("/v1/adapters", headers=b, json=mount).status_code == 200
    assert client.delete("/v1/adapters/mine", headers=b).status_code == 200
    assert complete(a, "mine").status_code == 200
    assert client.delete("/v1/adapters/mine", headers=a).status_code == 200
    assert complete(a, "mine").status_code == 400
