"""DiffusionGemma's block-diffusion generation in MLX (the engine's ``Denoiser``).

The procedure of transformers' ``DiffusionGemmaGenerationMixin.generate``:

1. the encoder writes the prompt into the KV cache;
2. per canvas (``canvas_length`` tokens): start from uniform-random ids, then for
   ``cur_step = N … 1`` run the decoder over [cache ++ canvas] (self-conditioned on the
   previous step's processed logits), divide the logits by the linear temperature schedule
   ``t_min + (t_max - t_min) * cur_step / N``, draw a denoised canvas, accept the
   lowest-entropy positions whose summed entropy stays within ``entropy_bound`` (the
   entropy-bound sampler), re-randomise the rest, and stop early once the argmax canvas is
   stable for ``stability_threshold`` steps and the mean entropy is below
   ``confidence_threshold``;
3. the final argmax canvas is the block: it is cut after its first end-of-sequence id,
   yielded (the server streams it as one settled block) and, if generation goes on,
   encoded into the cache as context for the next canvas.

Sampling (documented in docs/families.md): ``temperature`` 0 takes the argmax of the
scheduled logits for the denoised canvas (the OptiQ / mlx-vlm convention); a temperature
``T > 0`` draws from ``softmax(scheduled / T)``, so ``T = 1`` is the reference's
``multinomial``. The random canvas and re-noising always draw from the request's seed, so a
seeded request is reproducible at any temperature. ``max_tokens`` cuts the last block.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import attrs
import mlx.core as mx

from mlxrt.families.diffusion_gemma.model import DiffusionGemma, EncoderCache

__all__ = ["DenoiseSchedule", "DiffusionGenerator", "entropy_bound_accept", "scheduled_logits"]


@attrs.frozen
class DenoiseSchedule:
    """The denoising settings of ``generation_config.json`` (reference defaults when absent)."""

    max_denoising_steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    entropy_bound: float = 0.1
    stability_threshold: int | None = 1
    confidence_threshold: float | None = 0.005

    @classmethod
    def from_generation_config(cls, gen: Mapping[str, Any]) -> DenoiseSchedule:
        sampler = gen.get("sampler_config") or {}
        base = cls()
        return cls(
            max_denoising_steps=int(gen.get("max_denoising_steps") or base.max_denoising_steps),
            t_min=float(gen.get("t_min", base.t_min)), t_max=float(gen.get("t_max", base.t_max)),
            entropy_bound=float(sampler.get("entropy_bound", base.entropy_bound)),
            stability_threshold=gen.get("stability_threshold", base.stability_threshold),
            confidence_threshold=gen.get("confidence_threshold", base.confidence_threshold),
        )


def scheduled_logits(logits: mx.array, schedule: DenoiseSchedule, cur_step: int) -> mx.array:
    """The logits divided by the step's temperature (``cur_step`` counts the steps left)."""
    t = schedule.t_min + (schedule.t_max - schedule.t_min) * (cur_step / schedule.max_denoising_steps)
    return logits / t


def token_entropy(logits: mx.array) -> mx.array:
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return -(mx.exp(logp) * logp).sum(axis=-1)


def entropy_bound_accept(entropy: mx.array, bound: float) -> mx.array:
    """Which positions to accept: the lowest-entropy prefix ``k`` with
    ``sum(H_1..H_k) - max(H_1..H_k) <= bound`` (arXiv 2505.24857), per row of ``entropy``."""
    order = mx.argsort(entropy, axis=-1)
    ranked = mx.take_along_axis(entropy, order, axis=-1)
    chosen = (mx.cumsum(ranked, axis=-1) - ranked) <= bound
    return mx.take_along_axis(chosen, mx.argsort(order, axis=-1), axis=-1)


class DiffusionGenerator:
    """Runs one request's block diffusion; yields each settled block of token ids.

    :param model: The MLX text model.
    :param schedule: Denoising settings.
    :param eos: End-of-sequence ids (a block is cut after the first of them).
    :param prefill_chunk: Prompt tokens per encoder pass (an image prompt is encoded whole, so
        its image block attends both ways).
    """

    def __init__(self, model: DiffusionGemma, schedule: DenoiseSchedule, eos: Sequence[int], *,
                 prefill_chunk: int = 2048) -> None:
        self.model = model
        self.schedule = schedule
        self.eos = frozenset(int(t) for t in eos)
        self.prefill_chunk = max(int(prefill_chunk), 1)

    def generate(self, prompt: Any, request: Any, should_cancel: Callable[[], bool]) -> Iterator[list[int]]:
        """Blocks of generated ids for ``request`` (a ``GenerationRequest``).

        :param prompt: The request's prompt ids, or the spliced prompt of the family's vision
            adapter (``SplicedPrompt``: ``ids`` and ``embeddings``, see :mod:`.vision`).
        :param should_cancel: Polled before every decoder pass; True ends the generation.

        The total is at most ``request.max_tokens`` ids; the last block may hold an EOS id.
        """
        a = self.model.args
        cache = EncoderCache(a)
        left = int(request.max_tokens)
        if left <= 0:
            return
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(63)
        key = mx.random.key(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)  # any int the API allows (negatives too)
        self._prefill(prompt, cache)
        prompt = None  # image features are not needed past the prefill
        for _ in range(math.ceil(left / a.canvas_length)):
            key, sub = mx.random.split(key)
            block = self._denoise(cache, sub, float(request.sampling.temperature), should_cancel)
            if block is None:
                return
            cut = next((i + 1 for i, t in enumerate(block) if t in self.eos), len(block))
            out = block[:min(cut, left)]
            left -= len(out)
            yield out
            if cut < len(block) or left <= 0:
                return
            self.model.encode(block, cache)  # the finished canvas becomes context

    def _prefill(self, prompt: Any, cache: EncoderCache) -> None:
        """Encode the prompt: ids, or a spliced prompt (``ids`` and the encoder's input
        ``embeddings``, image rows included; its image-token runs attend both ways)."""
        embeddings = getattr(prompt, "embeddings", None)
        if embeddings is None:  # in chunks: a long prompt's attention scores stay bounded
            ids = list(prompt)
            for start in range(0, len(ids), self.prefill_chunk):
                self.model.encode(ids[start:start + self.prefill_chunk], cache)
            return
        from mlxrt.families.diffusion_gemma.vision import image_blocks

        ids = list(prompt.ids)
        self.model.encode(ids, cache, embeds=embeddings[None].astype(self.model.embed_weight.dtype),
                          image_blocks=image_blocks(ids, self.model.args.image_token_id))

    def _denoise(self, cache: EncoderCache, key: mx.array, temperature: float,
                 should_cancel: Callable[[], bool]) -> list[int] | None:
        a, s = self.model.args, self.schedule
        shape = (1, a.canvas_length)
        key, sub = mx.random.split(key)
        canvas = mx.random.randint(0, a.vocab_size, shape, key=sub)
        argmax = canvas
        history: list[mx.array] = []
        sc: mx.array | None = None
        dtype = self.model.embed_weight.dtype
        for cur_step in range(s.max_denoising_steps, 0, -1):
            if should_cancel():
                return None
            processed = scheduled_logits(self.model.decode(canvas, cache, sc), s, cur_step)
            key, k_draw, k_noise = mx.random.split(key, 3)
            if temperature <= 0:
                denoised = mx.argmax(processed, axis=-1)
            else:
                denoised = mx.random.categorical(processed / temperature, axis=-1, key=k_draw)
            argmax = mx.argmax(processed, axis=-1)
            entropy = token_entropy(processed)
            accept = entropy_bound_accept(entropy, s.entropy_bound)
            noise = mx.random.randint(0, a.vocab_size, shape, key=k_noise)
            canvas = mx.where(accept, denoised.astype(canvas.dtype), noise.astype(canvas.dtype))
            sc = processed.astype(dtype)
            mx.eval(canvas, argmax, entropy, sc)
            if s.stability_threshold is not None and s.confidence_threshold is not None:
                n = s.stability_threshold
                stable = n == 0 or (len(history) == n and all(mx.array_equal(h, argmax).item() for h in history))
                history = (history + [argmax])[-n:] if n else []
                if stable and float(entropy.mean()) < s.confidence_threshold:
                    break
        return [int(t) for t in cast("list[int]", argmax[0].tolist())]  # 1-D: a flat list
