"""DiffusionGemma in plain MLX: one set of Gemma-4 MoE transformer weights in two roles.

* The **encoder** runs causally over the prompt (and later over every finished canvas) and
  only writes the KV cache (:class:`EncoderCache`); image tokens of one image attend to each
  other bidirectionally when ``use_bidirectional_attention`` is ``"vision"``. Its layers are
  the decoder's layers with their own ``layer_scalar``.
* The **decoder** reads that cache (never writes it) and attends bidirectionally over
  [cache ++ canvas]: on sliding layers only the last ``sliding_window - 1`` cached positions.
  Its input embeddings pass through the self-conditioning block, fed by the previous
  denoising step's logits.

Weights load by their Hugging Face names (``model.decoder.*``,
``model.encoder.language_model.layers.N.layer_scalar``); the vision tower
(``model.encoder.vision_tower.*``, ``model.encoder.embed_vision.*``) is not part of this
module and loads lazily (:mod:`.vision`). Reference: transformers'
``modeling_diffusion_gemma.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import mlx.core as mx
import mlx.nn as nn

from mlxrt.families.gemma4.vision import RMSNorm, rms_norm

__all__ = ["TextArgs", "EncoderCache", "DiffusionGemma", "text_args_from_config", "load_text_model"]


@attrs.frozen
class TextArgs:
    """The text model's shape (``text_config``), with per-layer head sizes resolved."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    top_k_experts: int
    num_attention_heads: int
    layer_types: tuple[str, ...]
    head_dims: tuple[int, ...]
    kv_heads: tuple[int, ...]
    sliding_window: int
    rms_norm_eps: float
    final_logit_softcapping: float | None
    rope: Mapping[str, Mapping[str, Any]]
    bidirectional_vision: bool
    canvas_length: int
    image_token_id: int | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)


def text_args_from_config(config: Mapping[str, Any]) -> TextArgs:
    """Resolve ``config.json`` the way transformers' ``DiffusionGemmaTextConfig`` does.

    :raises ValueError: A setting this port does not implement (``use_bidirectional_attention
        = "all"``, a hidden activation other than ``gelu_pytorch_tanh``).
    """
    t = dict(config.get("text_config") or config)
    bidir = t.get("use_bidirectional_attention")
    if bidir not in (None, "vision"):
        raise ValueError(f"use_bidirectional_attention={bidir!r} is not supported (only 'vision' or none)")
    if t.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"hidden_activation {t.get('hidden_activation')!r} is not supported")
    n = int(t.get("num_hidden_layers", 30))
    types = list(t.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                          for i in range(n)])
    types[-1] = "full_attention"  # transformers forces the last layer to full attention
    nkv = int(t.get("num_key_value_heads", 4))
    gkv = t.get("num_global_key_value_heads")
    ghd = int(t.get("global_head_dim", 512))
    hd = int(t.get("head_dim", 256))
    full = [ty == "full_attention" for ty in types]
    rope = t.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    }
    return TextArgs(
        vocab_size=int(t.get("vocab_size", 262_144)), hidden_size=int(t["hidden_size"]),
        intermediate_size=int(t["intermediate_size"]), moe_intermediate_size=int(t["moe_intermediate_size"]),
        num_experts=int(t["num_experts"]), top_k_experts=int(t["top_k_experts"]),
        num_attention_heads=int(t["num_attention_heads"]), layer_types=tuple(types),
        head_dims=tuple(ghd if f else hd for f in full),
        kv_heads=tuple((int(gkv) if gkv is not None else nkv) if f else nkv for f in full),
        sliding_window=int(t.get("sliding_window", 512)), rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        final_logit_softcapping=t.get("final_logit_softcapping", 30.0), rope=rope,
        bidirectional_vision=bidir == "vision", canvas_length=int(config.get("canvas_length", 256)),
        image_token_id=config.get("image_token_id"),
    )


def inv_frequencies(rope: Mapping[str, Any], head_dim: int) -> mx.array:
    """RoPE inverse frequencies: ``default`` (optionally partial) or Gemma 4's ``proportional``
    (the rotated share of a full-size head; the remaining angles are zero, i.e. unrotated)."""
    base = float(rope["rope_theta"])
    share = float(rope.get("partial_rotary_factor", 1.0))
    if rope.get("rope_type", "default") == "proportional":
        angles = int(share * head_dim // 2)
        rotated = 1.0 / (base ** (mx.arange(0, 2 * angles, 2, dtype=mx.float32) / head_dim))
        rest = head_dim // 2 - angles
        freqs = mx.concatenate([rotated, mx.zeros((rest,))]) if rest > 0 else rotated
        return freqs / float(rope.get("factor", 1.0))
    dim = int(head_dim * share)
    return 1.0 / (base ** (mx.arange(0, dim, 2, dtype=mx.float32) / dim))


def rope_tables(inv_freq: mx.array, positions: mx.array, dtype: Any) -> tuple[mx.array, mx.array]:
    freqs = positions.astype(mx.float32)[:, None] * inv_freq[None, :]
    emb = mx.concatenate([freqs, freqs], axis=-1)
    return mx.cos(emb).astype(dtype), mx.sin(emb).astype(dtype)


def apply_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """``x`` is [B, L, heads, d]; ``cos``/``sin`` are [L, d] (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, a: TextArgs, i: int) -> None:
        super().__init__()
        d, kvh, h = a.head_dims[i], a.kv_heads[i], a.hidden_size
        self.head_dim = d
        self.eps = a.rms_norm_eps
        self.q_proj = nn.Linear(h, a.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, kvh * d, bias=False)
        if a.layer_types[i] == "sliding_attention":  # full-attention layers use K as V
            self.v_proj = nn.Linear(h, kvh * d, bias=False)
        self.o_proj = nn.Linear(a.num_attention_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, a.rms_norm_eps)
        self.k_norm = RMSNorm(d, a.rms_norm_eps)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array, mask: mx.array | None,
                 past: tuple[mx.array, mx.array] | None) -> tuple[mx.array, tuple[mx.array, mx.array]]:
        b, n, _ = x.shape
        shape = (b, n, -1, self.head_dim)
        q = apply_rope(self.q_norm(self.q_proj(x).reshape(shape)), cos, sin)
        k_raw = self.k_proj(x).reshape(shape)
        v = self.v_proj(x).reshape(shape) if "v_proj" in self else k_raw
        k = apply_rope(self.k_norm(k_raw), cos, sin)
        v = rms_norm(v, None, self.eps)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        keys, values = k, v
        if past is not None:
            keys = mx.concatenate([past[0], k], axis=2)
            values = mx.concatenate([past[1], v], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=1.0, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1)), (k, v)


def gelu(x: mx.array) -> mx.array:
    out: mx.array = nn.gelu_approx(x)  # mlx compiles it: its type is lost
    return out


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, a: TextArgs) -> None:
        super().__init__()
        self.proj = nn.Linear(a.hidden_size, a.num_experts, bias=False)
        self.scale = mx.ones((a.hidden_size,))
        self.per_expert_scale = mx.ones((a.num_experts,))
        self.eps = a.rms_norm_eps
        self.top_k = a.top_k_experts
        self.root = a.hidden_size**-0.5

    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array]:
        # Norm, then scale, as two steps: folding them changes bf16 rounding (FAMILIES.md 2.1).
        h = rms_norm(x, None, self.eps) * self.scale * self.root
        probs = mx.softmax(self.proj(h).astype(mx.float32), axis=-1)
        idx = mx.argpartition(-probs, kth=self.top_k - 1, axis=-1)[..., : self.top_k]
        weights = mx.take_along_axis(probs, idx, axis=-1)
        weights = weights / weights.sum(axis=-1, keepdims=True)
        return idx, weights * self.per_expert_scale[idx]


class Experts(nn.Module):
    """Routed experts stored as 3-D tensors, as the checkpoint has them."""

    def __init__(self, a: TextArgs) -> None:
        super().__init__()
        e, h, i = a.num_experts, a.hidden_size, a.moe_intermediate_size
        self.gate_up_proj = mx.zeros((e, 2 * i, h))
        self.down_proj = mx.zeros((e, h, i))

    def __call__(self, x: mx.array, idx: mx.array, weights: mx.array) -> mx.array:
        gate_up_w, down_w = self.gate_up_proj, self.down_proj
        dtype = x.dtype
        if dtype != mx.float32 and mx.default_device() == mx.cpu:
            # MLX's CPU gather_mm is float32-only: upcast per call (serve float32 on a CPU).
            x, gate_up_w, down_w = x.astype(mx.float32), gate_up_w.astype(mx.float32), down_w.astype(mx.float32)
        xe = mx.expand_dims(x, (-2, -3))  # [N, 1, 1, H]
        gate_up = mx.gather_mm(xe, gate_up_w.swapaxes(-1, -2), rhs_indices=idx)  # [N, K, 1, 2I]
        gate, up = mx.split(gate_up, 2, axis=-1)
        out = mx.gather_mm(gelu(gate) * up, down_w.swapaxes(-1, -2), rhs_indices=idx)  # [N, K, 1, H]
        return (out.squeeze(-2) * weights[..., None].astype(out.dtype)).sum(axis=-2).astype(dtype)


class Layer(nn.Module):
    """One transformer layer (the same weights serve the encoder and the decoder)."""

    NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
             "pre_feedforward_layernorm_2")

    def __init__(self, a: TextArgs, i: int) -> None:
        super().__init__()
        self.self_attn = Attention(a, i)
        self.mlp = MLP(a.hidden_size, a.intermediate_size)
        self.router = Router(a)
        self.experts = Experts(a)
        for name in self.NORMS:
            setattr(self, name, RMSNorm(a.hidden_size, a.rms_norm_eps))
        self.layer_scalar = mx.ones((1,))

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array, mask: mx.array | None,
                 past: tuple[mx.array, mx.array] | None, scalar: mx.array) -> tuple[mx.array, Any]:
        h, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        x = x + self.post_attention_layernorm(h)
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        idx, weights = self.router(flat)
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), idx, weights).reshape(x.shape)
        x = x + self.post_feedforward_layernorm(dense + self.post_feedforward_layernorm_2(routed))
        return x * scalar.astype(x.dtype), kv


class SelfConditioning(nn.Module):
    def __init__(self, a: TextArgs) -> None:
        super().__init__()
        self.pre_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)
        self.eps = a.rms_norm_eps

    def __call__(self, embeds: mx.array, soft: mx.array) -> mx.array:
        n = self.pre_norm(soft)
        return rms_norm(embeds + self.down_proj(gelu(self.gate_proj(n)) * self.up_proj(n)), None, self.eps)


class _Decoder(nn.Module):
    def __init__(self, a: TextArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = [Layer(a, i) for i in range(a.num_layers)]
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_conditioning = SelfConditioning(a)


class _ScalarOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer_scalar = mx.ones((1,))


class _EncoderText(nn.Module):
    def __init__(self, a: TextArgs) -> None:
        super().__init__()
        self.layers = [_ScalarOnly() for _ in range(a.num_layers)]


class _Encoder(nn.Module):
    def __init__(self, a: TextArgs) -> None:
        super().__init__()
        self.language_model = _EncoderText(a)


class _Inner(nn.Module):
    def __init__(self, a: TextArgs) -> None:
        super().__init__()
        self.decoder = _Decoder(a)
        self.encoder = _Encoder(a)


class EncoderCache:
    """The encoder's KV cache: per layer [B, kv_heads, T, d] keys and values.

    Sliding layers keep only the last ``sliding_window - 1`` positions (all an encoder query
    or the decoder can still see there); full layers keep everything. ``offset`` counts every
    position ever encoded (the next position id).
    """

    def __init__(self, args: TextArgs) -> None:
        self.args = args
        self.keys: list[mx.array | None] = [None] * args.num_layers
        self.values: list[mx.array | None] = [None] * args.num_layers
        self.offset = 0

    def past(self, i: int) -> tuple[mx.array, mx.array] | None:
        k, v = self.keys[i], self.values[i]  # stored together (store)
        return None if k is None or v is None else (k, v)

    def kept(self, i: int) -> int:
        k = self.keys[i]
        return 0 if k is None else k.shape[2]

    def store(self, i: int, k: mx.array, v: mx.array) -> None:
        past = self.past(i)
        if past is not None:
            k, v = mx.concatenate([past[0], k], axis=2), mx.concatenate([past[1], v], axis=2)
        if self.args.layer_types[i] == "sliding_attention":
            keep = self.args.sliding_window - 1
            k, v = k[:, :, -keep:], v[:, :, -keep:]
        self.keys[i], self.values[i] = k, v

    def state(self) -> list[mx.array]:
        return [t for t in self.keys + self.values if t is not None]


class DiffusionGemma(nn.Module):
    """The text model: ``encode`` writes the cache, ``decode`` turns a canvas into logits."""

    def __init__(self, args: TextArgs) -> None:
        super().__init__()
        self.args = args
        self.model = _Inner(args)
        self._inv = {ty: inv_frequencies(args.rope[ty], args.head_dims[args.layer_types.index(ty)])
                     for ty in set(args.layer_types)}

    @property
    def embed_weight(self) -> mx.array:
        return self.model.decoder.embed_tokens.weight

    def embed(self, ids: mx.array) -> mx.array:
        w = self.embed_weight
        return w[ids] * mx.array(math.sqrt(self.args.hidden_size), dtype=w.dtype)

    def _tables(self, positions: mx.array, dtype: Any) -> dict[str, tuple[mx.array, mx.array]]:
        return {ty: rope_tables(inv, positions, dtype) for ty, inv in self._inv.items()}

    def encode(self, ids: Sequence[int] | mx.array, cache: EncoderCache, *,
               embeds: mx.array | None = None, image_blocks: mx.array | None = None) -> None:
        """Run the encoder over ``ids`` (one row), appending their KV to ``cache``.

        :param embeds: [1, L, H] input embeddings to use instead of ``embed(ids)`` (image rows
            spliced in); ``ids`` then only gives the length.
        :param image_blocks: [L] int ids of the image block each position belongs to (-1 for
            text): positions of one block attend to each other both ways (``"vision"`` mode).
        """
        a = self.args
        ids = ids if isinstance(ids, mx.array) else mx.array(list(ids), dtype=mx.int32)
        x = embeds if embeds is not None else self.embed(ids[None])
        n, start = x.shape[1], cache.offset
        tables = self._tables(mx.arange(start, start + n), x.dtype)
        q_pos = mx.arange(start, start + n)[:, None]
        scalars = self.model.encoder.language_model.layers
        for i, layer in enumerate(self.model.decoder.layers):
            kept = cache.kept(i)
            k_pos = mx.arange(start - kept, start + n)[None, :]
            allowed = k_pos <= q_pos
            if a.layer_types[i] == "sliding_attention":
                allowed = allowed & (k_pos > q_pos - a.sliding_window)
            if image_blocks is not None and a.bidirectional_vision:
                blocks = mx.concatenate([mx.full((kept,), -1, dtype=image_blocks.dtype), image_blocks])
                allowed = allowed | ((image_blocks[:, None] == blocks[None, :]) & (image_blocks[:, None] >= 0))
            cos, sin = tables[a.layer_types[i]]
            x, (k, v) = layer(x, cos, sin, allowed, cache.past(i), scalars[i].layer_scalar)
            cache.store(i, k, v)
        cache.offset += n
        mx.eval(cache.state())

    def decode(self, canvas: mx.array, cache: EncoderCache, sc_logits: mx.array | None = None) -> mx.array:
        """Logits [1, C, V] (float32, softcapped) for ``canvas`` [1, C] over the read-only
        ``cache``; ``sc_logits`` are the previous step's processed logits (self-conditioning)."""
        a = self.args
        w = self.embed_weight
        scale = mx.array(math.sqrt(a.hidden_size), dtype=w.dtype)
        x = self.embed(canvas)
        if sc_logits is None:
            soft = mx.zeros_like(x)
        else:
            soft = (mx.softmax(sc_logits.astype(mx.float32), axis=-1).astype(w.dtype) @ w) * scale
        x = self.model.decoder.self_conditioning(x, soft)
        start = cache.offset
        tables = self._tables(mx.arange(start, start + canvas.shape[1]), x.dtype)
        for i, layer in enumerate(self.model.decoder.layers):
            cos, sin = tables[a.layer_types[i]]
            x, _ = layer(x, cos, sin, None, cache.past(i), layer.layer_scalar)
        h = self.model.decoder.norm(x)
        logits = (h @ w.T).astype(mx.float32)
        cap = a.final_logit_softcapping
        return mx.tanh(logits / cap) * cap if cap else logits


def text_weights(weights: Mapping[str, mx.array]) -> dict[str, mx.array]:
    """The text model's tensors of a checkpoint (the vision tower and stray heads dropped)."""
    drop = ("model.encoder.vision_tower.", "model.encoder.embed_vision.", "lm_head.")
    return {k: v for k, v in weights.items() if not k.startswith(drop) and "rotary_emb" not in k}


def load_text_model(path: str | Path, config: Mapping[str, Any]) -> DiffusionGemma:
    """Build the text model of the checkpoint folder ``path`` and load its weights by name.

    :raises ValueError: An unsupported setting, or tensors missing from or unknown to the model.
    """
    weights: dict[str, mx.array] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        weights.update(text_weights(cast("dict[str, mx.array]", mx.load(str(file)))))  # .safetensors: a dict
    model = DiffusionGemma(text_args_from_config(config))
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model
