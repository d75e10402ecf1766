"""mlxrt.testing: tiny real-format checkpoints that mlx-lm loads and generates with."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import TOKENIZERS as SHARED_TOKENIZERS

from mlxrt.testing import TINY_MODEL_TYPES, write_tiny_checkpoint

mlx_lm = pytest.importorskip("mlx_lm")
tokenizers = pytest.importorskip("tokenizers")

PROMPTS = ["hi", "What is the weather in Paris?", "Tell me a story about a cat.", "def add(a, b):"]

# A few parameter names per family, exactly as the real HF checkpoints name them.
EXPECTED_NAMES = {
    "llama": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
              "model.layers.1.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight", "model.norm.weight"],
    "qwen3": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
              "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
              "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"],
    "qwen3_5": ["model.language_model.embed_tokens.weight", "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
                "model.language_model.layers.0.linear_attn.A_log", "model.language_model.layers.0.linear_attn.conv1d.weight",
                "model.language_model.layers.1.self_attn.q_proj.weight", "model.language_model.layers.1.self_attn.q_norm.weight",
                "model.language_model.norm.weight", "model.visual.patch_embed.proj.weight",
                "model.visual.merger.linear_fc2.weight"],
    "gemma3_text": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_norm.weight",
                    "model.layers.1.self_attn.k_proj.weight", "model.layers.3.pre_feedforward_layernorm.weight",
                    "model.norm.weight"],
    "gemma4_text": ["model.embed_tokens.weight", "model.embed_tokens_per_layer.weight",
                    "model.per_layer_model_projection.weight", "model.layers.0.self_attn.q_norm.weight",
                    "model.layers.0.self_attn.k_proj.weight", "model.layers.0.per_layer_input_gate.weight",
                    "model.layers.0.layer_scalar", "model.layers.3.pre_feedforward_layernorm.weight"],
    "minicpm": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                "model.layers.1.mlp.gate_proj.weight", "model.norm.weight", "lm_head.weight"],
}
NOT_EXPECTED = {
    "llama": ["lm_head.weight"], "qwen3": ["lm_head.weight"], "qwen3_5": ["lm_head.weight"],
    "gemma3_text": ["lm_head.weight"],
    # layers 2 and 3 are KV-shared: no K/V projections, as in the real E2B/E4B checkpoints
    "gemma4_text": ["model.layers.2.self_attn.k_proj.weight", "model.layers.3.self_attn.v_proj.weight"],
    "minicpm": [],
}
# Generation prompt for [{"role": "user", "content": "hi"}] (thinking off where the family has it).
RENDERED = {
    "llama": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "qwen3_5": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "gemma4_text": "<bos><|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
    "gemma3_text": "<bos><|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
    "minicpm": "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
}
TOOL_PARSER = {"llama": None, "qwen3": "json_tools", "qwen3_5": "qwen3_coder", "gemma4_text": "gemma4",
               "gemma3_text": "gemma4",
               "minicpm": "minicpm5"}


def st_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def chat(tok, text: str = "hi", **kw) -> str:
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   tokenize=False, **kw)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """model_type -> (path, model, tokenizer), written and loaded once per module."""
    cache: dict = {}

    def get(model_type: str):
        if model_type not in cache:
            path = write_tiny_checkpoint(tmp_path_factory.mktemp(model_type), model_type)
            cache[model_type] = (path, *mlx_lm.load(str(path)))
        return cache[model_type]

    return get


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_loads_renders_and_generates(loaded, model_type):
    path, model, tok = loaded(model_type)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "special_tokens_map.json"):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == model_type
    text = chat(tok)
    assert isinstance(text, str) and "hi" in text
    assert chat(tok, enable_thinking=False).endswith(RENDERED[model_type])
    outs = [mlx_lm.generate(model, tok, chat(tok, p), max_tokens=8) for p in PROMPTS]
    assert all(isinstance(o, str) for o in outs)
    assert len(set(outs)) >= 2, f"random model is not context-sensitive: {outs}"


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_parameter_names_are_the_real_hf_names(loaded, model_type):
    path, model, _ = loaded(model_type)
    header = st_header(path / "model.safetensors")
    assert header["__metadata__"] == {"format": "pt"}
    names = set(header) - {"__metadata__"}
    missing = [n for n in EXPECTED_NAMES[model_type] if n not in names]
    assert not missing, missing
    assert not [n for n in NOT_EXPECTED[model_type] if n in names]
    assert all(h["dtype"] == "F32" for n, h in header.items() if n != "__metadata__")


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_seeded_and_byte_identical(tmp_path, model_type):
    a = write_tiny_checkpoint(tmp_path / "a", model_type, seed=7)
    b = write_tiny_checkpoint(tmp_path / "b", model_type, seed=7)
    c = write_tiny_checkpoint(tmp_path / "c", model_type, seed=8)
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_generated_tokenizer(loaded, model_type):
    path, _, tok = loaded(model_type)
    raw = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    assert 1000 <= raw.get_vocab_size() <= 2100
    config = json.loads((path / "config.json").read_text())
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    assert raw.get_vocab_size() <= vocab_size
    for s in ["Hello, world!", "  two  spaces\tand\ttabs\n\nnewlines", "café 東京 😀 Straße", "x = {'a': [1, 2]}"]:
        ids = tok.encode(s, add_special_tokens=False)
        assert ids == raw.encode(s, add_special_tokens=False).ids, s  # transformers == tokenizers
        assert tok.decode(ids) == s
    tcfg = json.loads((path / "tokenizer_config.json").read_text())
    assert tcfg["chat_template"].startswith("{# mlxrt test template #}")
    parser = tok.tool_parser
    assert (parser.__module__.rsplit(".", 1)[-1] if parser else None) == TOOL_PARSER[model_type]
    gen = json.loads((path / "generation_config.json").read_text())
    eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    assert set(eos) <= set(tok.eos_token_ids)


def test_family_special_tokens(loaded):
    _, _, qwen = loaded("qwen3")
    for t in ("<think>", "</think>", "<tool_call>", "</tool_call>"):  # not special: decode keeps them
        ids = qwen.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and qwen.decode(ids, skip_special_tokens=True) == t
    assert qwen.eos_token == "<|im_end|>" and qwen.has_thinking
    _, _, gemma = loaded("gemma4_text")
    real_ids = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<|tool_call>": 48, "<tool_call|>": 49, '<|"|>': 52,
                "<|think|>": 98, "<|channel>": 100, "<channel|>": 101, "<|turn>": 105, "<turn|>": 106, "\n": 107}
    assert {t: gemma.convert_tokens_to_ids(t) for t in real_ids} == real_ids
    assert gemma.encode("hi")[0] == 2  # the post-processor adds <bos>
    assert chat(gemma, enable_thinking=True).startswith("<bos><|turn>system\n<|think|>\n<turn|>\n")
    _, _, mc = loaded("minicpm")
    assert {t: mc.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<think>", "</think>")} == {
        "<s>": 0, "</s>": 1, "<think>": 8, "</think>": 9}
    assert chat(mc, enable_thinking=True).endswith("<|im_start|>assistant\n<think>\n")
    _, _, q35 = loaded("qwen3_5")
    assert chat(q35, enable_thinking=True).endswith("<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize("dtype,tag", [("bfloat16", "BF16"), ("float16", "F16")])
def test_half_dtypes(tmp_path, dtype, tag):
    import mlx.core as mx

    f32 = mx.load(str(write_tiny_checkpoint(tmp_path / "f32", "qwen3") / "model.safetensors"))
    path = write_tiny_checkpoint(tmp_path / dtype, "qwen3", dtype=dtype)
    header = st_header(path / "model.safetensors")
    assert {h["dtype"] for n, h in header.items() if n != "__metadata__"} == {tag}
    half = mx.load(str(path / "model.safetensors"))
    k = "model.layers.0.self_attn.q_proj.weight"
    assert mx.array_equal(half[k], f32[k].astype(getattr(mx, dtype))).item()  # round to nearest even
    model, tok = mlx_lm.load(str(path))
    assert isinstance(mlx_lm.generate(model, tok, chat(tok), max_tokens=4), str)


def test_config_overrides_shape_the_weights(tmp_path):
    path = write_tiny_checkpoint(tmp_path / "l", "llama", config_overrides={"num_hidden_layers": 3})
    assert "model.layers.2.mlp.up_proj.weight" in st_header(path / "model.safetensors")
    model, tok = mlx_lm.load(str(path))
    assert len(model.layers) == 3
    path = write_tiny_checkpoint(tmp_path / "m", "minicpm",
                                 config_overrides={"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    model, tok = mlx_lm.load(str(path))  # the real MiniCPM5 layout: a Llama with an untied lm_head
    assert type(model).__module__ == "mlx_lm.models.llama"
    assert isinstance(mlx_lm.generate(model, tok, chat(tok), max_tokens=4), str)


def test_rejects_unknown_arguments(tmp_path):
    with pytest.raises(ValueError):
        write_tiny_checkpoint(tmp_path / "x", "gpt2")
    with pytest.raises(ValueError):
        write_tiny_checkpoint(tmp_path / "y", "qwen3", dtype="int8")


@pytest.mark.parametrize("model_type,tokenizer", [("qwen3", "qwen3"), ("gemma4_text", "gemma3"),
                                                  ("gemma3_text", "gemma3"), ("qwen3_5", "qwen3_5")])
def test_real_tokenizers(tmp_path, model_type, tokenizer):
    src = SHARED_TOKENIZERS / tokenizer
    if not (src / "tokenizer.json").is_file():
        pytest.skip(f"{src} is absent (needs the ../shared checkout)")
    path = write_tiny_checkpoint(tmp_path / model_type, model_type, tokenizer_dir=src)
    assert (path / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    raw = tokenizers.Tokenizer.from_file(str(src / "tokenizer.json"))
    config = json.loads((path / "config.json").read_text())
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    assert raw.get_vocab_size(with_added_tokens=True) <= vocab_size < raw.get_vocab_size() + 64 + 64
    model, tok = mlx_lm.load(str(path))
    text = chat(tok)
    template = json.loads((path / "tokenizer_config.json").read_text())["chat_template"]
    if model_type == "qwen3_5":  # the folder ships no template: ours, marked
        assert template.startswith("{# mlxrt test template #}") and text.endswith("<think>\n")
    elif model_type == "qwen3":
        assert chat(tok, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert tok.convert_tokens_to_ids("<|im_end|>") == 151645 and 151645 in tok.eos_token_ids
    else:  # Gemma 3 template, pad/eos/bos = 0/1/2
        assert text.startswith("<bos><start_of_turn>user\nhi")
        assert (config["pad_token_id"], config["bos_token_id"]) == (0, 2) and 1 in tok.eos_token_ids
    assert isinstance(mlx_lm.generate(model, tok, text, max_tokens=8), str)
