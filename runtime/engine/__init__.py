"""The engine room: the worker thread that owns MLX and everything it runs per request.

The worker (:mod:`mlxrt.engine.engine`), its serial and batch lanes, the denoising lane,
speculative decoding, quantized KV caches, the memory contract and admission, the sampler chain,
LoRA adapters, image splicing, embeddings, the BLAS of MLX's CPU backend, and the pool of
engines one process serves.
"""
