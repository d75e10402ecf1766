"""The engine room: the worker thread that owns MLX and everything it runs per request.

The worker (:mod:`mlxrt.engine.engine`), its serial and batch lanes, the denoising lane,
speculative decoding, quantized KV caches, the memory contract and admission, the sampler chain,
LoRA adapters, image splicing and embeddings. The pool of engines one process serves is
:mod:`mlxrt.model_pool` (the server's model router); the BLAS loader is :mod:`mlxrt.blas`.
"""
