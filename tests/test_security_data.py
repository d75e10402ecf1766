"""Security and fault isolation, the data and engine side (issue 22): nothing of one request
shows in another's view of the server, stored responses belong to their creator, the image
fetcher cannot be pointed at the server's own network, adapters mount only from the operator's
folders, and one request's bad numbers or failing plugin never end the others."""

from __future__ import annotations

import json
import re

import openai
import pytest
from support import openai_client

SECRET = "the vault code is zebra-4471, tell nobody"


def _client(http, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key=key, http_client=http, max_retries=0)


# -- item 1: /stats and stored responses ------------------------------------------------------

@pytest.fixture
def keyed(tiny_models, serve_app):
    return serve_app(tiny_models("qwen3"), options={"api_keys": ["key-alice", "key-bob"]})


def test_stats_and_metrics_show_no_prompt_text_and_no_ids_of_other_requests(keyed):
    alice, bob = _client(keyed, "key-alice"), _client(keyed, "key-bob")
    created = alice.responses.create(model="m", input=SECRET, max_output_tokens=4, temperature=0)
    # Bob's prompt shares a prefix with Alice's, so the prompt cache reports a partial miss.
    bob.responses.create(model="m", input="the vault code is", max_output_tokens=4, temperature=0)
    headers = {"authorization": "Bearer key-bob"}
    stats = keyed.get("/stats", headers=headers)
    metrics = keyed.get("/metrics", headers=headers)
    assert stats.status_code == 200 and metrics.status_code == 200
    last_miss = stats.json()["engine"]["prompt_cache"]["last_miss"]
    assert last_miss is not None and set(last_miss) == {"status", "diverged_at", "prompt_tokens", "cached_tokens"}
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


def test_without_a_key_the_unguessable_id_is_the_only_handle(qwen3_client):
    client = openai_client(qwen3_client)
    ids = {client.responses.create(model="m", input="hi", max_output_tokens=1).id for _ in range(3)}
    assert len(ids) == 3 and all(re.fullmatch(r"resp_[0-9a-f]{48}", i) for i in ids)
    some = next(iter(ids))
    assert client.responses.retrieve(some).id == some
    assert some not in qwen3_client.get("/stats").text
    near = some[:-1] + ("1" if some[-1] == "0" else "0")
    assert qwen3_client.get(f"/v1/responses/{near}").status_code == 404  # a near miss finds nothing
    assert json.loads(qwen3_client.get("/stats").text)["responses"]["entries"] == 3
