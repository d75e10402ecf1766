"""Structured-output benchmark: decode tok/s with a grammar vs without, same model, same load.

Serves a tiny random checkpoint in-process (``mlxrt.testing.write_tiny_checkpoint``: per-token
overhead dominates there, so the grammar's cost shows most) and streams chat completions at
temperature 1 with a fixed ``max_tokens``, once free and once under a grammar that cannot
finish within it (a long regex, or a JSON schema: an array of many small objects). Decode
tok/s per request is (tokens - 1) / (last token - first token); the median over requests is
printed, then the ratio grammar / free (target >= 0.9).

    python benchmarks/structured.py                          # tiny qwen3, its generated tokenizer
    python benchmarks/structured.py --tokenizer qwen3        # the real 151k Qwen3 vocabulary
    python benchmarks/structured.py --tokenizer gemma3 --batch 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

TOKENIZERS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tokenizers"
FORMATS = {
    "regex": {"type": "regex", "regex": "[a-z ]{4000}"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "rows", "schema": {
        "type": "array", "minItems": 500,
        "items": {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
                  "required": ["id", "ok"], "additionalProperties": False}}}},
}


def _decode_rate(client, fmt, *, max_tokens: int, seed: int) -> tuple[float, int]:
    """(tokens - 1) / (last content chunk - first content chunk), tokens from the usage."""
    stamps, tokens = [], 0
    kw = {"response_format": fmt} if fmt else {}
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"Write something long ({seed})."}],
        max_tokens=max_tokens, temperature=1.0, seed=seed, stream=True,
        stream_options={"include_usage": True}, **kw)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return ((tokens - 1) / span if span > 0 else float("nan")), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", help="a folder name under ../shared/data/tokenizers (default: generated)")
    parser.add_argument("--model-type", default="qwen3")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    import openai
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host
    from mlxrt.testing import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp) / "tiny", args.model_type,
                                     tokenizer_dir=TOKENIZERS / args.tokenizer if args.tokenizer else None)
        host = make_host()
        app = build_server(host, str(path), {"host": "127.0.0.1", "port": 0, "batch": args.batch})
        with TestClient(app) as http:
            client = openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="-", http_client=http, max_retries=0)
            runs = [("free", None), *FORMATS.items()]
            for name, fmt in runs:  # warm-up: compiles each grammar once
                t0 = time.perf_counter()
                _decode_rate(client, fmt, max_tokens=8, seed=999)
                print(f"{name:12s} first request (8 tokens, incl. grammar compile) "
                      f"{(time.perf_counter() - t0) * 1e3:7.1f} ms")
            # Interleaved, so drift in a shared machine's load hits every variant alike.
            rates: dict[str, list[float]] = {name: [] for name, _fmt in runs}
            for seed in range(args.requests):
                for name, fmt in runs:
                    rates[name].append(_decode_rate(client, fmt, max_tokens=args.max_tokens, seed=seed)[0])
            for name, _fmt in runs:
                print(f"{name:12s} decode {statistics.median(rates[name]):8.1f} tok/s (median of {args.requests})")
            free = statistics.median(rates["free"])
            for name in FORMATS:
                ratio = statistics.median(rates[name]) / free
                print(f"ratio {name}/free: {ratio:.3f} ({'meets' if ratio >= 0.9 else 'misses'} the 0.9 target)")
            print(json.dumps({"tokenizer": args.tokenizer or "generated", "batch": args.batch,
                              **{k: statistics.median(v) for k, v in rates.items()}}))
        app.state.models.stop()


if __name__ == "__main__":
    main()
