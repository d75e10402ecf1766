"""The prompt cache: prefix KV reuse in memory (:mod:`mlxrt.cache.prompt_cache`), on disk
(:mod:`mlxrt.cache.prompt_store`) and its files (:mod:`mlxrt.cache.prompt_files`)."""
