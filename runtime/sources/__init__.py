"""Where model folders come from, before :mod:`mlxrt.loading` loads them: Hugging Face downloads
and the local library, the embedded SmolLM2, GGUF conversion, the static fit check, the served
dtype and the load-time family self-test."""
