"""The engine room: the worker thread that owns MLX and everything it runs per request.

The engine facade (:mod:`mlxrt.engine.engine`), the worker's set-up after a load
(:mod:`mlxrt.engine.worker_setup`), the scheduler that queues and admits requests
(:mod:`mlxrt.engine.scheduler`), the seam for peers that share the model
(:mod:`mlxrt.engine.peers`), the serial and batch lanes, the denoising lane,
speculative decoding, quantized KV caches, the memory contract and admission, the sampler chain,
LoRA adapters, image splicing and embeddings. The pool of engines one process serves is
:mod:`mlxrt.model_pool` (the server's model router); the BLAS loader is :mod:`mlxrt.blas`.
"""
