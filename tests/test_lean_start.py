"""What a server's start does without mlx-lm's heavy modules: mlxrt's own token loop
(:mod:`mlxrt.engine.steps`) and weight loader (:mod:`mlxrt.loading.weights`) against the
mlx-lm functions they stand in for, and a served request in a process that never imports
transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from mlxrt.testing import write_tiny_checkpoint

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

PROMPT = [(7 * i + 3) % 90 + 5 for i in range(40)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("lean")
    return {t: write_tiny_checkpoint(root / t, t) for t in ("llama", "qwen3_5", "gemma3_text")}


def _run(steps_fn, model, **kwargs):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    progress: list[tuple[int, int]] = []
    out = []
    for token, logprobs in steps_fn(mx.array(PROMPT), model, cache, progress, **kwargs):
        out.append((int(token), logprobs))
    return out, progress, [getattr(layer, "offset", None) for layer in cache]


def _ours(prompt, model, cache, progress, **kw):
    from mlxrt.engine.steps import token_steps

    return token_steps(prompt, model, cache=cache, stream=mx.default_stream(mx.default_device()),
                       progress=lambda d, t: progress.append((d, t)), prefill_step_size=16,
                       max_tokens=kw["max_tokens"], sampler=kw.get("sampler"), processors=kw.get("processors"))


def _theirs(prompt, model, cache, progress, **kw):
    from mlx_lm.generate import generate_step

    return generate_step(prompt, model, prompt_cache=cache, stream=mx.default_stream(mx.default_device()),
                         prompt_progress_callback=lambda d, t: progress.append((d, t)), prefill_step_size=16,
                         max_tokens=kw["max_tokens"], sampler=kw.get("sampler"),
                         logits_processors=kw.get("processors"))


@pytest.mark.parametrize("model_type", ["llama", "qwen3_5", "gemma3_text"])
def test_token_steps_equal_mlx_lm_generate_step(checkpoints, model_type):
    """Greedy and seeded sampling with a penalty processor, prefilled in chunks: the same
    tokens, log-probabilities, progress reports and final cache length as mlx-lm's loop."""
    from mlx_lm.sample_utils import make_logits_processors, make_sampler
    from mlx_lm.utils import load_model

    model, _ = load_model(checkpoints[model_type])
    for kwargs in ({}, {"sampler": "seeded", "processors": "penalty"}):
        runs = []
        for fn in (_ours, _theirs):
            kw = {"max_tokens": 12}
            if kwargs:
                mx.random.seed(7)
                kw["sampler"] = make_sampler(temp=1.0, top_k=20)
                kw["processors"] = make_logits_processors(repetition_penalty=1.3, repetition_context_size=8)
            runs.append(_run(fn, model, **kw))
        (ours, our_progress, our_offsets), (theirs, their_progress, their_offsets) = runs
        assert [t for t, _ in ours] == [t for t, _ in theirs]
        for (_, a), (_, b) in zip(ours, theirs, strict=True):
            assert mx.allclose(a, b, atol=1e-5).item()
        assert our_progress == their_progress
        assert our_progress[0] == (0, len(PROMPT)) and our_progress[-1] == (len(PROMPT), len(PROMPT))
        assert our_offsets == their_offsets


@pytest.mark.parametrize("stop_after", [1, 3])
def test_token_steps_stopped_early_leave_the_last_token_fed(checkpoints, stop_after):
    """A caller that stops after token k finds token k in the cache (the lone-stream hand-over
    to the batch trims exactly one token), the first token included (handed out before the
    step that feeds it is queued)."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    from mlxrt.engine.steps import token_steps

    model, _ = load_model(checkpoints["llama"])
    cache = make_prompt_cache(model)
    steps = token_steps(mx.array(PROMPT), model, cache=cache, stream=mx.default_stream(mx.default_device()),
                        max_tokens=10)
    got = [next(steps) for _ in range(stop_after)]
    steps.close()
    assert len(got) == stop_after
    assert cache[0].offset == len(PROMPT) + stop_after
    # the fed token's keys are the ones a fresh prefill of the prompt and the tokens gives
    fresh = make_prompt_cache(model)
    model(mx.array([*PROMPT, *(int(t) for t, _ in got)])[None], cache=fresh)
    assert mx.allclose(cache[0].state[0], fresh[0].state[0], atol=1e-4).item()


def _parameters(model):
    from mlx.utils import tree_flatten

    return dict(tree_flatten(model.parameters()))


@pytest.mark.parametrize("model_type", ["llama", "qwen3_5", "gemma3_text", "quantized", "quantized-copy"])
def test_weights_equal_mlx_lm_load_model(checkpoints, tmp_path, model_type):
    """The same architecture class, parameter names, dtypes and values as mlx-lm's loader,
    also for a checkpoint MLX quantized (4-bit, group 32), with and without the
    ``quantization_config`` copy MLX writers keep beside ``quantization`` (loaded here, not
    handed to mlx-lm)."""
    from mlx_lm.utils import load_model

    from mlxrt.loading import weights
    from mlxrt.loading.weights import eos_token_ids, load_architecture_and_weights

    path = checkpoints.get(model_type)
    if model_type.startswith("quantized"):
        from mlx_lm.convert import convert

        path = tmp_path / "q"
        convert(str(checkpoints["llama"]), str(path), quantize=True, q_group_size=32, q_bits=4)
        config = json.loads((path / "config.json").read_text())
        assert "quantization" in config
        if model_type == "quantized-copy":
            config["quantization_config"] = config["quantization"]
            (path / "config.json").write_text(json.dumps(config))
        weights._load(path, None, False)  # the lean path takes it (raises _NeedsMlxLm otherwise)
    ours, our_config = load_architecture_and_weights(path)
    theirs, their_config = load_model(path)
    assert type(ours) is type(theirs)
    assert our_config == their_config
    assert eos_token_ids(path) == our_config.get("eos_token_id")  # what the tokenizer loads beside the weights
    a, b = _parameters(ours), _parameters(theirs)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert mx.array_equal(a[name], b[name]).item(), name
    if model_type.startswith("quantized"):
        assert any(name.endswith(".scales") for name in a)


def test_weights_loader_hands_unusual_checkpoints_to_mlx_lm(checkpoints, tmp_path):
    """A checkpoint asking for a custom model file goes to mlx-lm, whose refusal is kept."""
    import shutil

    from mlxrt.loading.weights import load_architecture_and_weights

    path = tmp_path / "custom"
    shutil.copytree(checkpoints["llama"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_file": "modeling.py"}))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_architecture_and_weights(path)


def _converted(source, out):
    """``source`` quantized by mlx_lm.convert (4-bit, group 32; its config.json carries both
    ``quantization`` and ``quantization_config``, as mlxrt's GGUF conversion writes them)."""
    from mlx_lm.convert import convert

    convert(str(source), str(out), quantize=True, q_group_size=32, q_bits=4)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == config["quantization_config"]
    return out


def test_dequantize_model_equals_mlx_lm(checkpoints, tmp_path):
    """``--dtype`` casts dequantize with mlxrt's copy of mlx-lm's dequantize_model: the same
    layer classes, parameter names and values."""
    from mlx_lm.utils import dequantize_model as theirs

    from mlxrt.loading.weights import dequantize_model, load_architecture_and_weights

    path = _converted(checkpoints["llama"], tmp_path / "q")
    a, _ = load_architecture_and_weights(path)
    b, _ = load_architecture_and_weights(path)
    assert any(name.endswith(".scales") for name in _parameters(a))
    dequantize_model(a)
    theirs(b)
    assert [type(m).__name__ for _, m in a.named_modules()] == [type(m).__name__ for _, m in b.named_modules()]
    pa, pb = _parameters(a), _parameters(b)
    assert pa.keys() == pb.keys() and not any(name.endswith(".scales") for name in pa)
    for name in pa:
        assert mx.array_equal(pa[name], pb[name]).item(), name


@pytest.mark.parametrize("kind", ["llama", "quantized", "quantized-float32"])
def test_a_served_request_never_imports_transformers(checkpoints, tmp_path, kind):
    """Load, warm up and answer one chat completion, then a concurrent burst (the batch lane, the
    default), in a fresh process: mlx_lm's __init__, mlx_lm.generate, mlx_lm.utils, transformers,
    numpy and pydantic are never imported (the lean start: docs/performance.md) — also for an MLX-quantized
    checkpoint (as the embedded SmolLM2 is) served as --dtype auto picks and cast by ``--dtype float32``:
    its ``quantization_config`` copy beside ``quantization`` once sent it to mlx-lm's loader, and
    the embedded SmolLM2 printed transformers' PyTorch warning."""
    path = checkpoints["llama"] if kind == "llama" else _converted(checkpoints["llama"], tmp_path / "q")
    options = {"host": "127.0.0.1", "port": 0, **({"dtype": "float32"} if kind == "quantized-float32" else {})}
    script = textwrap.dedent(f"""
        import sys
        from mlxrt.compat import lean_mlx_lm
        lean_mlx_lm()  # what `mlxrt serve` runs first (test_mlxrt_serve_takes_the_lean_path)
        from concurrent.futures import ThreadPoolExecutor
        from litestar.testing import TestClient
        from mlxrt.cli import build_server
        from mlxrt.host import make_host
        host = make_host()
        app = build_server(host, {str(path)!r}, {options!r})
        with TestClient(app, base_url="http://127.0.0.1") as client:
            def ask(i):
                r = client.post("/v1/chat/completions", json={{"messages": [{{"role": "user", "content": f"hi {{i}}"}}],
                                "max_tokens": 6}})
                assert r.status_code == 200, r.text
            ask(0)
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(ask, range(1, 9)))
            stats = client.get("/stats").json()["engine"]
            print("DTYPE", (client.get("/stats").json().get("dtype") or {{}}).get("served"))
            print("LANES", stats["lane"], stats["served_by_lane"]["batch"] > 0)
        heavy = sorted(m for m in ("transformers", "mlx_lm.generate", "mlx_lm.utils", "mlx_lm.convert",
                                   "huggingface_hub.hf_api", "numpy", "pydantic") if m in sys.modules)
        print("HEAVY", heavy)
        app.state.models.stop()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "LANES batch True" in out.stdout, out.stdout  # the burst shared the batch lane
    if kind == "quantized-float32":
        assert "DTYPE float32" in out.stdout, out.stdout


@pytest.mark.parametrize("module", ["mlxrt", "mlxrt.testing", "mlxrt.testing.pytest_plugin"])
def test_importing_mlxrt_leaves_mlx_lm_alone(module):
    """``import mlxrt`` (also its test support, which pytest loads in every run of an environment
    where mlxrt is installed) registers no mlx_lm module and changes no import machinery: a
    later ``import mlx_lm`` runs mlx-lm's own __init__, as in a process without mlxrt."""
    script = textwrap.dedent(f"""
        import sys
        hooks = (list(sys.meta_path), list(sys.path_hooks))
        import {module}
        print("registered", "mlx_lm" in sys.modules, any(m.startswith("mlx_lm.") for m in sys.modules))
        print("machinery", (list(sys.meta_path), list(sys.path_hooks)) == hooks)
        import mlx_lm
        print("package", "load" in vars(mlx_lm), "__getattr__" in vars(mlx_lm))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["registered False False", "machinery True", "package True False"], out.stdout


def test_mlxrt_serve_takes_the_lean_path(checkpoints, tmp_path):
    """A real ``mlxrt serve`` (the command, in its own process) loads a model and answers a chat
    completion without running mlx_lm/__init__.py or importing transformers, PyYAML, pdb or the
    distributed engine: Python's own import log (``PYTHONPROFILEIMPORTTIME``) lists what the
    process imported. The deferred PyYAML still serves ``/schema/openapi.yaml`` when asked."""
    import os
    import time

    import httpx
    from support import MLXRT_BIN, free_port

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([MLXRT_BIN, "serve", str(checkpoints["llama"]), "--port", str(port)],
                                env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}, stdout=sink,
                                stderr=subprocess.STDOUT, cwd="/")
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "mlxrt serve did not become healthy"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.25)
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert answer.status_code == 200, answer.text
            imported = {line.rsplit("|", 1)[1].strip() for line in log.read_text().splitlines()
                        if line.startswith("import time:") and "|" in line}
            schema = httpx.get(f"http://127.0.0.1:{port}/schema/openapi.yaml", timeout=60)
            assert schema.status_code == 200 and "openapi: 3.1.0" in schema.text, schema.text[:500]
        finally:
            proc.terminate()
            proc.wait(30)
    # (the log lists import statements; importlib.import_module, which loads the model's module, is not in it)
    assert {"mlx_lm.models.cache", "mlx_lm.sample_utils", "uvicorn"} <= imported
    assert "mlx_lm" not in imported  # the package module was made without running its __init__
    assert not {m for m in imported if m.split(".")[0] == "transformers"}
    # Litestar imports these at module level (mlxrt.compat.defer_module): yaml's submodules and
    # pdb's bdb would be logged had either run; the distributed engine is for --distributed.
    assert not {m for m in imported if m.split(".")[0] == "yaml" or m == "bdb"}
    assert not {m for m in imported if m.startswith("mlxrt.distributed.") and m != "mlxrt.distributed.launch"}
