"""--prompt-cache-dir: prompt-cache entries on disk, restored after a restart; damaged and
foreign files ignored with a warning; the folder kept under its size cap."""

from __future__ import annotations

import os

import mlx.core as mx
import openai
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache

from mlxrt.cache.prompt_store import PersistentPromptCache, _reference_cache
from mlxrt.testing import write_tiny_checkpoint

SYSTEM = "You are a careful assistant. " + " ".join(f"rule {i}: be brief." for i in range(40))


def ask(url: str, question: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(
        model="m", max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def cached(reply) -> int:
    details = reply.usage.prompt_tokens_details
    return details.cached_tokens if details is not None else 0


def entry_files(folder):
    return sorted(folder.glob("*/*.safetensors"))


def test_entries_survive_a_restart_and_bad_files_are_ignored(mlxrt_tiny_checkpoint, server_process, tmp_path):
    import httpx

    model, store = mlxrt_tiny_checkpoint("qwen3"), tmp_path / "store"
    first = server_process([str(model), "--prompt-cache-dir", str(store)])
    cold = ask(first.url, "What is the rule?")
    assert cached(cold) == 0 and cold.usage.prompt_tokens > 200
    first.stop()  # SIGTERM: the queued write finishes before the process exits
    (written,) = entry_files(store)

    # Damaged and foreign files beside it: garbage, a cut-off copy, another model's entry.
    folder = written.parent
    (folder / "garbage.safetensors").write_bytes(b"\x00not a safetensors file at all")
    (folder / "cut.safetensors").write_bytes(written.read_bytes()[:1000])
    other_model = write_tiny_checkpoint(tmp_path / "other", "qwen3", seed=3, config_overrides={"num_hidden_layers": 1})
    other_store = tmp_path / "other-store"
    other = server_process([str(other_model), "--prompt-cache-dir", str(other_store)])
    ask(other.url, "What is the rule?")
    other.stop()
    (foreign,) = entry_files(other_store)
    (folder / "foreign.safetensors").write_bytes(foreign.read_bytes())
    # ... and one that claims to be ours (its fingerprint rewritten) but holds one layer, not two.
    # It is the newest file, so it is tried first: its check fails and the real entry is used.
    forged = folder / "forged.safetensors"
    forged.write_bytes(foreign.read_bytes().replace(foreign.parent.name.encode(), folder.name.encode()))
    os.utime(written, (1, 1))

    second = server_process([str(model), "--prompt-cache-dir", str(store)])
    warm = ask(second.url, "What is the rule?")
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert cached(warm) > 0.9 * cold.usage.prompt_tokens
    partial = ask(second.url, "Another question entirely?")  # the shared system prompt is reused
    assert cached(partial) > 200
    disk = httpx.get(f"{second.url}/stats").json()["engine"]["prompt_cache"]["disk"]
    assert disk["restored"] == 1 and disk["ignored"] == 4
    log = second.stop()
    for name in ("garbage", "cut", "foreign", "forged"):
        assert f"ignoring {folder / name}.safetensors" in log
    assert "another model" in log and "cache layers" in log


@pytest.fixture(scope="module")
def model():
    mx.random.seed(0)
    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=128,
                           tie_word_embeddings=True)
    m = llama.Model(args)
    mx.eval(m.parameters())
    return m


def filled(model, tokens):
    cache = make_prompt_cache(model)
    logits = model(mx.array([list(tokens)]), cache=cache)[0, -1]
    mx.eval(logits)
    return cache, logits


def store(model, folder, *, identity=lambda key: "", cap=1 << 30, fingerprint="f" * 24):
    return PersistentPromptCache(folder, fingerprint, reference=_reference_cache([model]), max_disk_bytes=cap,
                                 adapter_identity=identity)


def test_a_restored_entry_gives_the_same_logits_as_a_cold_run(model, tmp_path):
    prompt = list(range(3, 60))
    first = store(model, tmp_path)
    first.insert(prompt, filled(model, prompt)[0])
    first.close()

    second = store(model, tmp_path)
    assert second.entries == 0  # lazily: nothing is loaded before a prompt needs it
    longer = prompt + [70, 71, 72]
    found = second.fetch(longer)
    assert found.status == "hit" and found.reused == len(prompt)
    warm = model(mx.array([longer[found.reused:]]), cache=found.cache)[0, -1]
    assert mx.allclose(warm, filled(model, longer)[1], atol=1e-4).item()
    assert second.stats()["disk"]["restored"] == 1
    # Another adapter set never gets it, and neither does an adapter whose files changed.
    assert store(model, tmp_path).fetch(longer, key=("lora",)).reused == 0
    changed = store(model, tmp_path, identity=lambda key: "other weights")
    assert changed.fetch(longer).reused == 0


def test_the_folder_stays_under_its_cap_and_covered_entries_are_replaced(model, tmp_path):
    cache = store(model, tmp_path)
    cache.insert(list(range(1, 40)), filled(model, range(1, 40))[0])
    cache.insert(list(range(1, 50)), filled(model, range(1, 50))[0])  # covers the first: replaces it
    cache.close()
    (one,) = entry_files(tmp_path)
    size = one.stat().st_size

    capped = store(model, tmp_path, cap=int(size * 2.5))
    for start in (100, 200, 300, 400):
        tokens = list(range(start, start + 49))
        capped.insert(tokens, filled(model, [t % 128 for t in tokens])[0])
    capped.close()
    files = entry_files(tmp_path)
    assert len(files) == 2 and sum(f.stat().st_size for f in files) <= size * 2.5
    kept = store(model, tmp_path)
    assert kept.fetch(list(range(400, 449)) + [1]).reused == 49  # the newest survived
    assert kept.fetch(list(range(1, 50)) + [1]).reused == 0  # the oldest went first


def test_an_unusable_folder_is_a_clear_start_up_error(mlxrt_tiny_checkpoint, tmp_path):
    import subprocess

    from support import MLXRT_BIN

    (tmp_path / "a-file").write_text("")
    out = subprocess.run([MLXRT_BIN, "serve", str(mlxrt_tiny_checkpoint("qwen3")), "--prompt-cache-dir",
                          str(tmp_path / "a-file" / "cache"), "--port", "1"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "--prompt-cache-dir" in out.stderr and "Not a directory" in out.stderr
    assert "Traceback" not in out.stderr and "terminate" not in out.stderr


def test_batch_lane_entries_are_persisted_and_restored(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    from support import openai_client

    options = {"batch": 2, "prompt_cache_dir": str(tmp_path)}
    first = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options=options)
    prompt = "hello there " * 30
    cold = openai_client(first).completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0)
    first.app.state.models.primary.engine.stop()  # finishes the write
    second = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options=options)
    warm = openai_client(second).completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0)
    assert second.get("/stats").json()["engine"]["lane"] == "batch"
    assert warm.choices[0].text == cold.choices[0].text and cached(warm) > 0
