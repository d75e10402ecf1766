"""POST /v1/embeddings on a tiny Qwen3-Embedding-layout checkpoint, through the openai client."""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import openai_client

from mlxrt.engine.embedding import (
    embed_ids,
    encode_inputs,
    is_embedding_model,
    plan_batches,
    query_text,
)
from mlxrt.loading.resolve import ModelSource, read_model_info

TEXTS = ["The sea is blue.", "A cat sat on the mat and looked at the birds outside the window.", "hi",
         "def add(a, b):\n    return a + b"]
INPUT_ERROR = "`input` must be a string, an array of strings, an array of token ids or an array of token-id arrays"
NOT_EMBEDDING = ('served model "qwen3-0-gen" is not an embedding model; serve an embedding model '
                 "(e.g. Qwen3-Embedding) to use /v1/embeddings")


@pytest.fixture
def emb(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3_embedding"))


def vectors(out) -> np.ndarray:
    return np.array([d.embedding for d in out.data], dtype=np.float32)


def test_float_and_base64_through_the_sdk(emb):
    client = openai_client(emb)
    plain = client.embeddings.create(model="any", input=TEXTS)  # the SDK asks for base64 and decodes it
    floats = client.embeddings.create(model="any", input=TEXTS, encoding_format="float")
    b64 = client.embeddings.create(model="any", input=TEXTS, encoding_format="base64")
    assert plain.object == "list" and plain.model == "qwen3_embedding-0-gen"
    assert [d.index for d in floats.data] == [0, 1, 2, 3] and {d.object for d in floats.data} == {"embedding"}
    assert vectors(floats).shape == (4, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors(floats), axis=1), 1.0, atol=1e-5)
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in b64.data])
    assert np.array_equal(decoded, vectors(floats))  # float32 both ways: bit-identical
    assert np.array_equal(vectors(plain), vectors(floats))
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS)


def test_same_text_same_vector_different_texts_differ(emb):
    client = openai_client(emb)
    a = vectors(client.embeddings.create(model="m", input=TEXTS[0]))[0]
    again = vectors(client.embeddings.create(model="m", input=[TEXTS[0]]))[0]
    other = vectors(client.embeddings.create(model="m", input=TEXTS[1]))[0]
    assert np.array_equal(a, again)
    assert float(a @ other) < 0.99


def test_batch_equals_one_by_one(emb):
    client = openai_client(emb)
    texts = TEXTS + [t.upper() for t in TEXTS] + ["x " * 40]
    batched = vectors(client.embeddings.create(model="m", input=texts))
    single = np.stack([vectors(client.embeddings.create(model="m", input=t))[0] for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_matches_an_unpadded_forward_of_the_last_token(emb):
    import mlx.core as mx

    engine = emb.app.state.models.primary.engine
    ids = encode_inputs(engine.tokenizer, TEXTS, engine.tokenizer.convert_tokens_to_ids("<|endoftext|>"), None)
    got = vectors(openai_client(emb).embeddings.create(model="m", input=TEXTS))

    def reference(loaded):
        rows = [np.array(loaded.model.model(mx.array([i]))[0, -1].astype(mx.float32)) for i in ids]
        return np.stack([r / np.linalg.norm(r) for r in rows])

    import anyio

    async def run():
        return await engine.call(reference)

    np.testing.assert_allclose(got, anyio.run(run), atol=1e-5)


def test_usage_counts_every_token_including_the_end_token(emb):
    tok = emb.app.state.models.primary.engine.tokenizer
    out = openai_client(emb).embeddings.create(model="m", input=TEXTS)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    counts = [len(tok.encode(t, add_special_tokens=False)) + 1 for t in TEXTS]
    assert all(tok.encode(t)[-1] == eot for t in TEXTS)  # the tokenizer's post-processor appends it
    assert out.usage.prompt_tokens == sum(counts)


def test_instruction_applies_the_query_format(emb):
    client = openai_client(emb)
    doc = vectors(client.embeddings.create(model="m", input="capital of France"))[0]
    body = {"instruction": "Given a question, retrieve passages that answer it"}
    query = vectors(client.embeddings.create(model="m", input="capital of France", extra_body=body))[0]
    formatted = vectors(client.embeddings.create(
        model="m", input=f"Instruct: {body['instruction']}\nQuery:capital of France"))[0]
    assert float(doc @ query) < 0.999
    np.testing.assert_allclose(query, formatted, atol=1e-6)
    assert query_text("t", None) == "t" and query_text("t", "do") == "Instruct: do\nQuery:t"


def test_dimensions_truncate_and_renormalize(emb):
    client = openai_client(emb)
    full = vectors(client.embeddings.create(model="m", input=TEXTS))
    short = vectors(client.embeddings.create(model="m", input=TEXTS, dimensions=16))
    assert short.shape == (4, 16)
    head = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, head, atol=1e-5)


def test_alias_path_and_raw_shape(emb):
    resp = emb.post("/embeddings", json={"input": "hi", "encoding_format": "float"})
    assert resp.status_code == 200
    body = resp.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert set(body["data"][0]) == {"object", "index", "embedding"}
    assert body["usage"] == {"prompt_tokens": body["usage"]["prompt_tokens"],
                             "total_tokens": body["usage"]["prompt_tokens"]}


def test_non_embedding_model_is_a_400_naming_it(mlxrt_client):
    client = openai_client(mlxrt_client)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="m", input="hi")
    assert err.value.status_code == 400
    assert err.value.body["message"] == NOT_EMBEDDING and err.value.body["type"] == "invalid_request_error"
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert out.choices[0].message.content is not None  # still serving


@pytest.mark.parametrize("body,message", [
    ({}, INPUT_ERROR),
    ({"input": 3}, INPUT_ERROR),
    ({"input": []}, INPUT_ERROR),
    ({"input": ""}, INPUT_ERROR),
    ({"input": ["ok", None]}, INPUT_ERROR),
    ({"input": ["x"] * 2049}, "`input` may hold at most 2048 inputs"),
    # Token ids (OpenAI's API takes them): integers in the vocabulary, never mixed with text.
    ({"input": ["ok", 12]}, f"{INPUT_ERROR}, not a mix of them"),
    ({"input": [[1, 2], "ok"]}, f"{INPUT_ERROR}, not a mix of them"),
    ({"input": [[1, 2], 3]}, f"{INPUT_ERROR}, not a mix of them"),
    ({"input": [1, 2.5]}, "input[1] must be an integer token id, not 2.5"),
    ({"input": [[1, 2], [3.0]]}, "input[1][0] must be an integer token id, not 3.0"),
    ({"input": [[1, 2], ["a"]]}, 'input[1][0] must be an integer token id, not "a"'),
    ({"input": [[1, True]]}, "input[0][1] must be an integer token id, not true"),
    ({"input": [[1, 2], []]}, "input[1] must hold at least one token id"),
    ({"input": [5, -1]}, "input[1]: token id -1 is not in the vocabulary (0 to "),
    ({"input": [[5, 10**9]]}, "input[0][1]: token id 1000000000 is not in the vocabulary (0 to "),
    ({"input": [[1]] * 2049}, "`input` may hold at most 2048 inputs"),
    ({"input": [1, 2], "instruction": "find"}, "instruction applies to text inputs only"),
    ({"input": "hi", "encoding_format": "int8"}, 'encoding_format must be "float" or "base64"'),
    ({"input": "hi", "encoding_format": 1}, "encoding_format must be of type str"),
    ({"input": "hi", "dimensions": 0}, "dimensions must be at least 1"),
    ({"input": "hi", "dimensions": 65}, "dimensions must be at most 64"),
    ({"input": "hi", "dimensions": "8"}, "dimensions must be of type int"),
    ({"input": "hi", "dimensions": True}, "dimensions must be of type int"),
    ({"input": "hi", "instruction": 3}, "instruction must be of type str"),
    ({"input": "hi " * 41000}, "input 0 has "),
])
def test_bad_input_is_a_400_and_the_server_keeps_serving(emb, body, message):
    resp = emb.post("/v1/embeddings", json=body)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["message"].startswith(message) and err["type"] == "invalid_request_error"
    assert emb.post("/v1/embeddings", json={"input": "still here"}).status_code == 200


def test_token_id_inputs_embed_like_their_text(emb, mlxrt_tiny_checkpoint):
    """``[12, 34]`` is one input, ``[[12, 34], [56]]`` several: each embeds as the text those
    ids spell (the end token appended as for text), through the official client too."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(mlxrt_tiny_checkpoint("qwen3_embedding") / "tokenizer.json"))
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in TEXTS[:2]]
    client = openai_client(emb)
    texts = client.embeddings.create(model="m", input=TEXTS[:2], encoding_format="float")
    several = client.embeddings.create(model="m", input=ids, encoding_format="float")
    one = client.embeddings.create(model="m", input=ids[0], encoding_format="float")
    np.testing.assert_allclose(vectors(several), vectors(texts), atol=1e-5)
    np.testing.assert_allclose(vectors(one), vectors(texts)[:1], atol=1e-5)
    assert several.usage.prompt_tokens == texts.usage.prompt_tokens == sum(len(i) + 1 for i in ids)
    assert [d.index for d in several.data] == [0, 1]


def test_invalid_json_is_a_400(emb):
    resp = emb.post("/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "invalid JSON body"


# -- the checkpoint and the model side ---------------------------------------------------------


def st_names(path) -> set[str]:
    raw = (path / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return set(json.loads(raw[8:8 + n])) - {"__metadata__"}


def test_tiny_embedding_checkpoint_has_the_real_repo_layout(mlxrt_tiny_checkpoint):
    path = mlxrt_tiny_checkpoint("qwen3_embedding")
    names = st_names(path)
    assert "embed_tokens.weight" in names and "layers.0.self_attn.q_norm.weight" in names and "norm.weight" in names
    assert not [n for n in names if n.startswith("model.") or n.startswith("lm_head")]
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    modules = json.loads((path / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((path / "1_Pooling" / "config.json").read_text())["pooling_mode_lasttoken"] is True
    st = json.loads((path / "config_sentence_transformers.json").read_text())
    assert st["prompts"]["query"].startswith("Instruct: ") and st["prompts"]["query"].endswith("\nQuery:")
    tcfg = json.loads((path / "tokenizer_config.json").read_text())
    assert tcfg["eos_token"] == "<|endoftext|>" and tcfg["padding_side"] == "left"


def test_plain_mlx_lm_rejects_the_layout_and_the_qwen_family_loads_it(mlxrt_tiny_checkpoint):
    import mlx_lm

    from mlxrt.host import make_host
    from mlxrt.loading import load_model

    path = mlxrt_tiny_checkpoint("qwen3_embedding")
    with pytest.raises(ValueError, match="parameters not in model"):
        mlx_lm.load(str(path))
    loaded, profile = load_model(read_model_info(ModelSource(path, "e", "folder")), make_host())
    assert profile.provenance["load_model"] == "qwen"
    ids = encode_inputs(loaded.tokenizer, ["hi"], loaded.tokenizer.convert_tokens_to_ids("<|endoftext|>"), None)
    assert embed_ids(loaded, ids).shape == (1, 64)


def test_which_models_are_embedding_models(mlxrt_tiny_checkpoint, tmp_path):
    info = read_model_info(ModelSource(mlxrt_tiny_checkpoint("qwen3_embedding"), "e", "folder"))
    assert is_embedding_model(info)
    assert not is_embedding_model(read_model_info(ModelSource(mlxrt_tiny_checkpoint("qwen3"), "q", "folder")))
    assert is_embedding_model(type(info)(model_id="b", path=tmp_path, model_type="qwen3",
                                         config={"architectures": ["Qwen3Model"]}))
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "1_Pooling", "type": "x.Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert not is_embedding_model(type(info)(model_id="m", path=tmp_path, model_type="qwen3"))


def test_the_end_token_is_appended_once_when_the_tokenizer_does_not(mlxrt_tiny_checkpoint):
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(mlxrt_tiny_checkpoint("qwen3"))  # the chat tokenizer: no post-processor EOS
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    (ids,) = encode_inputs(tok, ["hello"], eot, None)
    assert ids == tok.encode("hello") + [eot]
    (ids,) = encode_inputs(tok, ["hello<|endoftext|>"], eot, None)
    assert ids.count(eot) == 1 and ids[-1] == eot


@given(st.lists(st.integers(1, 3000), max_size=60), st.integers(64, 8192))
def test_plan_batches_covers_every_input_once_within_the_budgets(lengths, budget):
    batches = plan_batches(lengths, max_batch_tokens=budget, max_padding=0.25)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest, real = max(lengths[i] for i in b), sum(lengths[i] for i in b)
        assert len(b) == 1 or (longest * len(b) <= budget and longest * len(b) - real <= 0.25 * real)
