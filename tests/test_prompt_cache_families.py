"""The prompt cache reuses prefixes on every family: plain KV (llama, qwen3), sliding windows
(gemma3_text, gemma4_text: RotatingKVCache past its window) and hybrid recurrent state
(qwen3_5: gated-DeltaNet ArraysCache layers beside full attention), in both lanes, over the
OpenAI and Anthropic dialects, with a LoRA adapter, with --kv-quant and across a restart
with --prompt-cache-dir. Each warm answer is compared with a cold run of the same prompt
(the cache emptied first) token for token (greedy)."""

from __future__ import annotations

import time

import pytest
from support import anthropic_client, openai_client

from mlxrt.testing import write_random_adapter, write_tiny_checkpoint

#: Sliding windows of 32 tokens: every prompt below outgrows them.
FAMILIES = {
    "llama": {}, "qwen3": {}, "qwen3_5": {}, "gemma3_text": {},
    "gemma4_text": {"sliding_window": 32},
}
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and plainly." for i in range(12))
TOOLS_SYSTEM = "You are an agent that edits code. " + " ".join(f"Guideline {i}: read before you write." for i in range(20))
TOOLS = [{"name": "read_file", "description": "Read a file from the workspace.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
         {"name": "run", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
MAX_TOKENS = 6
#: Tokens a generation prompt takes at most (Gemma 4's "<|turn>model\n<|channel>thought\n<channel|>").
GENERATION_PROMPT = 8


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    made = {family: write_tiny_checkpoint(root / family, family, config_overrides=over)
            for family, over in FAMILIES.items()}
    # Gemma 4 with its own 512-token window: the prompts below stay inside it.
    made["gemma4_text_512"] = write_tiny_checkpoint(root / "gemma4_text_512", "gemma4_text")
    return made


@pytest.fixture(scope="module")
def servers(checkpoints):
    """Factory: (family, options) -> an in-process server, one per combination in this module."""
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    made: dict = {}

    def start(family: str, **options):
        key = (family, tuple(sorted(options.items())))
        if key not in made:
            host = make_host()
            app = build_server(host, str(checkpoints[family]),
                               {"host": "127.0.0.1", "port": 0, "model_fallback": True, **options})
            client = TestClient(app, base_url="http://127.0.0.1")  # a Host the loopback server serves
            client.__enter__()
            made[key] = (client, app)
        return made[key][0]

    yield start
    for client, app in made.values():
        client.__exit__(None, None, None)
        app.state.models.stop()


def forget(http) -> None:
    """Empty the server's prompt cache (on its worker), so the next request runs cold."""
    engine = http.app.state.models.primary.engine
    engine.call_blocking(lambda _loaded: engine.prompt_cache.clear())


def chat(http, messages):
    reply = openai_client(http).chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    parsed = reply.parse()
    return parsed.choices[0].message.content, parsed.usage, reply.headers["x-mlxrt-cache"]


def cached(usage) -> int:
    details = usage.prompt_tokens_details
    return details.cached_tokens if details is not None else 0


def turns(question: str):
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return first, lambda answer: first + [{"role": "assistant", "content": answer},
                                          {"role": "user", "content": "And why is that so?"}]


def check_turns(http, question: str) -> None:
    """Exact repeat and next turn reuse the prompt; both answer as a cold run does."""
    first, second = turns(question)
    forget(http)
    cold, usage, header = chat(http, first)
    assert cached(usage) == 0 and header.startswith("miss") and usage.prompt_tokens > 64
    again, usage2, header = chat(http, first)
    assert again == cold
    assert cached(usage2) == usage.prompt_tokens - 1, header
    follow = second(cold)
    warm, usage3, header = chat(http, follow)
    # At least up to the turn boundary: a template that renders the answered turn without the
    # <think> its generation prompt opened (Qwen) diverges there.
    assert cached(usage3) >= usage.prompt_tokens - GENERATION_PROMPT, header
    forget(http)
    reference, usage4, _ = chat(http, follow)
    assert cached(usage4) == 0 and warm == reference


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("batch", [1, 2], ids=["serial", "batch"])
def test_repeat_and_next_turn_reuse_the_prompt(servers, family, batch):
    http = servers(family, batch=batch)
    assert http.get("/stats").json()["engine"]["lane"] == ("batch" if batch > 1 else "serial")
    check_turns(http, f"Which rule comes first for {family}?")


@pytest.mark.parametrize("family", FAMILIES)
def test_claude_code_shaped_turns_over_the_anthropic_dialect(servers, family):
    http = servers(family)
    client = anthropic_client(http)
    messages = [{"role": "user", "content": "List the files, then read the README."}]

    def ask(msgs):
        reply = client.messages.create(model="m", max_tokens=MAX_TOKENS, system=TOOLS_SYSTEM, tools=TOOLS,
                                       messages=msgs, extra_body={"temperature": 0})
        return [block.model_dump() for block in reply.content], reply.usage

    forget(http)
    cold, usage = ask(messages)
    assert usage.cache_read_input_tokens == 0 and usage.input_tokens > 100
    answer = "".join(block.get("text") or "" for block in cold) or "Done."
    follow = messages + [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "Now run the tests."}]
    warm, usage2 = ask(follow)
    assert usage2.cache_read_input_tokens >= usage.input_tokens - GENERATION_PROMPT
    forget(http)
    reference, usage3 = ask(follow)
    assert usage3.cache_read_input_tokens == 0 and warm == reference


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("batch", [1, 2], ids=["serial", "batch"])
def test_entries_survive_a_restart(checkpoints, family, batch, tmp_path):
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    first, _second = turns("What does rule three say?")
    options = {"host": "127.0.0.1", "port": 0, "prompt_cache_dir": str(tmp_path), "batch": batch,
               "model_fallback": True}
    answers = []
    for _run in range(2):
        host = make_host()
        app = build_server(host, str(checkpoints[family]), options)
        with TestClient(app, base_url="http://127.0.0.1") as http:
            answers.append(chat(http, first))
            stats = http.get("/stats").json()["engine"]["prompt_cache"]
        app.state.models.stop()  # finishes the queued writes
    (cold, usage, _), (warm, usage2, header) = answers
    assert cached(usage) == 0 and warm == cold
    assert cached(usage2) == usage.prompt_tokens - 1, header
    assert stats["disk"]["restored"] == 1 and stats["disk"]["ignored"] == 0


@pytest.fixture(scope="module")
def adapter(checkpoints, tmp_path_factory):
    return write_random_adapter(tmp_path_factory.mktemp("lora") / "style", checkpoints["gemma3_text"],
                                seed=1, rank=4, scale=2.0)


@pytest.mark.parametrize("batch", [1, 2], ids=["serial", "batch"])
def test_sliding_window_with_a_lora_adapter(servers, adapter, batch):
    http = servers("gemma3_text", adapter_path=str(adapter), batch=batch)
    assert http.get("/stats").json()["engine"]["adapters"]["default"] == ["style"]
    check_turns(http, "Which rule applies with the adapter?")


def test_sliding_window_with_quantized_kv(servers):
    http = servers("gemma3_text", kv_quant="8", kv_group_size=32)  # head dim 32
    assert http.get("/stats").json()["engine"]["kv_quant"]["bits"] == 8
    check_turns(http, "Which rule applies when the cache is quantized?")


@pytest.mark.parametrize("family, reason", [("gemma3_text", "sliding window"), ("qwen3_5", "recurrent state")])
def test_a_rewritten_history_is_explained(servers, family, reason):
    """A prompt that leaves a cached one midway can only reuse an earlier snapshot; the miss
    explanation names what kept the closer entry from being rewound."""
    http = servers(family)
    first, _ = turns("Tell me about rule one.")
    forget(http)
    chat(http, first)
    edited = [first[0], {"role": "user", "content": "Tell me about rule two instead, please."}]
    _text, usage, header = chat(http, edited)
    assert f"reason={reason}" in header
    stats = http.get("/stats").json()["engine"]["prompt_cache"]
    assert stats["last_miss"]["reason"] == reason
    assert cached(usage) < stats["last_miss"]["diverged_at"]


def test_a_dropped_think_block_is_where_the_next_turn_diverges(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Qwen3's template renders an answered turn without its <think> block: the next turn
    reuses the prompt up to there, and the header says where and why it stopped."""
    from support import Scripted

    http = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted())])
    first, second = turns("Think first, then answer.")
    reply = openai_client(http).chat.completions.with_raw_response.create(
        model="m", messages=first, max_tokens=40, temperature=0,
        extra_body={"script": "<think>\nweighing the rules\n</think>\n\nRule one."})
    turn1 = reply.parse()
    assert turn1.choices[0].message.content == "Rule one."
    warm, usage, header = chat(http, second("Rule one."))
    boundary = turn1.usage.prompt_tokens  # the cache went on with "<think>", the new prompt with "Rule one."
    assert header == (f"partial; cached={boundary}; prompt={usage.prompt_tokens}; diverged_at={boundary}; "
                      "reason=prompt diverged")
    last_miss = http.get("/stats").json()["engine"]["prompt_cache"]["last_miss"]
    assert (last_miss["diverged_at"], last_miss["reason"]) == (boundary, "prompt diverged")
    forget(http)
    assert chat(http, second("Rule one."))[0] == warm


@pytest.mark.parametrize("family, stored", [("gemma3_text", 3), ("qwen3_5", 3), ("llama", 1), ("gemma4_text_512", 1)])
def test_snapshots_are_entries_counted_in_the_byte_cap(servers, family, stored):
    """A model whose cache cannot be rewound stores its turn-boundary and last-token snapshots
    beside the finished cache, each counted in entries and bytes; a plain KV cache, or a
    sliding window the request stays inside, only the finished one (it can be trimmed back)."""
    http = servers(family)
    forget(http)
    first, _ = turns("How many entries does this leave?")
    _answer, usage, _ = chat(http, first)
    if family == "gemma4_text_512":
        assert usage.prompt_tokens + MAX_TOKENS < 512
        _again, usage2, _ = chat(http, first)  # reused by trimming the finished cache
        assert cached(usage2) == usage.prompt_tokens - 1
    # The worker stores a finished request's entries after its last event reaches the client:
    # wait (briefly) for them rather than race the response (seen once under load).
    deadline = time.monotonic() + 10
    while True:
        stats = http.get("/stats").json()["engine"]["prompt_cache"]
        if stats["entries"] >= stored or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stats["entries"] == stored
    engine = http.app.state.models.primary.engine
    held = engine.call_blocking(lambda _loaded: [e.nbytes for e in engine.prompt_cache._entries])
    assert stats["bytes"] == sum(held) and min(held) > 0
