"""Speculative decoding (--draft-model): greedy output is the same with and without a draft,
with and without prompt-cache hits, through the official openai client."""

from __future__ import annotations

import openai
import pytest
from support import openai_client

from mlxrt.testing import write_tiny_checkpoint

PROMPT = "The quick brown fox jumps over the lazy dog while " + " ".join(f"w{i}" for i in range(40))
MESSAGES = [{"role": "system", "content": "You are terse. " * 12}, {"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """Another tiny qwen3: other weights, one layer instead of two, the same generated tokenizer."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("draft") / "qwen3-draft", "qwen3", seed=7,
                                 config_overrides={"num_hidden_layers": 1})


def complete(client, prompt=PROMPT, **extra):
    return client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0,
                                     extra_body=extra or None)


def chat(client, **extra):
    return client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=0,
                                          extra_body=extra or None)


def cached(reply) -> int:
    details = reply.usage.prompt_tokens_details
    return details.cached_tokens if details is not None else 0


def test_greedy_output_is_identical_with_a_draft_model(mlxrt_tiny_checkpoint, mlxrt_serve, draft_dir):
    model = mlxrt_tiny_checkpoint("qwen3")
    plain = openai_client(mlxrt_serve(model, options={"prompt_cache_size": 0}))
    want_text, want_chat = complete(plain).choices[0].text, chat(plain).choices[0].message.content
    assert complete(plain, prompt=PROMPT + " more").choices[0].text  # a fresh prompt for below

    http = mlxrt_serve(model, options={"draft_model": str(draft_dir), "num_draft_tokens": 3})
    client = openai_client(http)
    first = complete(client)
    assert first.choices[0].text == want_text and cached(first) == 0
    again = complete(client)  # a prompt-cache hit: both models' caches come from the entry
    assert again.choices[0].text == want_text and cached(again) > 0
    assert chat(client).choices[0].message.content == want_chat
    assert chat(client).choices[0].message.content == want_chat  # hit
    # Decoded without the draft (the entry's draft half is caught up), then with it from that entry.
    assert complete(client, num_draft_tokens=0).choices[0].text == want_text
    assert complete(client, num_draft_tokens=5).choices[0].text == want_text
    # Log-probabilities come from the served model's verification forward.
    with_lp = chat(client, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    want_lp = chat(plain, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    assert [t.token for t in with_lp] == [t.token for t in want_lp] and want_lp
    assert [t.logprob for t in with_lp] == pytest.approx([t.logprob for t in want_lp], abs=1e-3)
    # A partial hit: the entry is trimmed to the common prefix in both halves.
    longer = complete(client, prompt=PROMPT + " more")
    assert longer.choices[0].text == complete(plain, prompt=PROMPT + " more").choices[0].text
    assert cached(longer) > 0
    stats = http.get("/stats").json()["engine"]
    spec = stats["speculative"]
    assert stats["lane"] == "serial" and spec["draft_model"].endswith("qwen3-draft")
    assert spec["requests"] == 7 and spec["requests_without_draft"] == 1 and spec["tokens"] > 0


def test_the_model_as_its_own_draft_accepts_every_draft_and_still_matches(mlxrt_tiny_checkpoint, mlxrt_serve):
    model = mlxrt_tiny_checkpoint("qwen3")
    alone = mlxrt_serve(model)
    want = complete(openai_client(alone)).choices[0].text
    http = mlxrt_serve(model, options={"draft_model": str(model), "num_draft_tokens": 4, "batch": 4})
    # Admission counts the draft's weights and KV too (here: the same model twice).
    single, both = (c.get("/stats").json()["engine"]["admission"] for c in (alone, http))
    assert both["weight_bytes"] == 2 * single["weight_bytes"]
    assert both["kv_bytes_per_token"] == 2 * single["kv_bytes_per_token"] > 0
    client = openai_client(http)
    assert complete(client).choices[0].text == want
    stats = http.get("/stats").json()["engine"]
    assert stats["lane"] == "serial"  # a draft model takes every request to the serial lane
    spec = stats["speculative"]
    # Every token but the served model's own one per step comes from the draft.
    assert spec["tokens"] > 0 and spec["draft_tokens_accepted"] >= spec["tokens"] * 3 // 5
    # Decoded without the draft, the entry's draft half is caught up on the generated tokens:
    # the next request reuses the entry and its draft still agrees with every step.
    other = "Once upon a time " * 10
    plain = complete(client, prompt=other, num_draft_tokens=0).choices[0].text
    again = complete(client, prompt=other)
    assert again.choices[0].text == plain and cached(again) > 0
    after = http.get("/stats").json()["engine"]["speculative"]
    tokens, accepted = after["tokens"] - spec["tokens"], after["draft_tokens_accepted"] - spec["draft_tokens_accepted"]
    assert tokens > 0 and accepted >= tokens * 3 // 5


def test_num_draft_tokens_is_validated(mlxrt_tiny_checkpoint, mlxrt_serve, draft_dir):
    client = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"draft_model": str(draft_dir)}))
    for bad in (-1, "3", 2.5, True):
        with pytest.raises(openai.BadRequestError) as err:
            complete(client, num_draft_tokens=bad)
        assert "num_draft_tokens" in str(err.value)
    assert complete(client).choices[0].text is not None  # still serving


def test_a_draft_with_another_vocabulary_is_refused_at_start(mlxrt_tiny_checkpoint, tmp_path):
    import subprocess

    from support import MLXRT_BIN

    other = write_tiny_checkpoint(tmp_path / "llama-draft", "llama")
    out = subprocess.run([MLXRT_BIN, "serve", str(mlxrt_tiny_checkpoint("qwen3")), "--draft-model", str(other),
                          "--port", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1  # not 134: a worker that failed to load must not abort the process
    assert "--draft-model" in out.stderr and "tokenizer does not match" in out.stderr
    assert "Traceback" not in out.stderr and "terminate" not in out.stderr  # a clean exit, not an abort


def test_a_draft_model_works_with_the_prompt_cache_on_disk(mlxrt_tiny_checkpoint, mlxrt_serve, draft_dir, tmp_path):
    model, options = mlxrt_tiny_checkpoint("qwen3"), {"draft_model": str(draft_dir), "prompt_cache_dir": str(tmp_path)}
    want = complete(openai_client(mlxrt_serve(model))).choices[0].text
    first = mlxrt_serve(model, options=options)
    assert complete(openai_client(first)).choices[0].text == want
    first.app.state.models.primary.engine.stop()  # finishes the write
    second = mlxrt_serve(model, options=options)
    again = complete(openai_client(second))  # both models' KV come back from the file
    assert again.choices[0].text == want and cached(again) > 0
    assert second.get("/stats").json()["engine"]["prompt_cache"]["disk"]["restored"] == 1


def test_plugin_samplers_and_logits_processors_decode_without_the_draft(mlxrt_tiny_checkpoint, mlxrt_serve, draft_dir):
    from support import Scripted

    model = mlxrt_tiny_checkpoint("qwen3")
    plain = openai_client(mlxrt_serve(model, plugins=[("scripted", Scripted())]))
    http = mlxrt_serve(model, plugins=[("scripted", Scripted())], options={"draft_model": str(draft_dir)})
    client = openai_client(http)
    # A stateful plugin sampler: the draft's proposals must not advance it.
    reply = complete(client, script="exactly this text")
    assert reply.choices[0].text == "exactly this text"
    # Penalties see the whole history only outside mlx-lm's speculative loop.
    assert complete(client, repetition_penalty=1.5).choices[0].text == \
        complete(plain, repetition_penalty=1.5).choices[0].text
    spec = http.get("/stats").json()["engine"]["speculative"]
    assert spec["requests"] == 0 and spec["requests_without_draft"] == 2
