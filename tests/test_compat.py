"""One test per private name of a dependency that mlxrt touches (all of them in mlxrt.compat):
an upgrade that moves one fails the test named for it."""

from __future__ import annotations

import importlib

import pytest

from mlxrt import compat
from mlxrt.testing import write_tiny_checkpoint

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")


def test_mlx_launch_entry_point_is_where_launch_calls_it():
    from mlxrt.distributed.launch import launch_command

    module = importlib.import_module("mlx._distributed_utils.launch")
    assert callable(module.main)
    command = launch_command(["serve", "m"], hosts=None, hostfile=None, backend=None, starting_port=5000,
                             python="python3")
    assert command[1:3] == ["-c", compat.MLX_LAUNCH_CODE]
    assert "mlx._distributed_utils.launch" in compat.MLX_LAUNCH_CODE


def test_hf_tokenizer_is_inside_mlx_lm_tokenizer_wrapper(tmp_path):
    import transformers
    from mlx_lm.tokenizer_utils import load

    path = write_tiny_checkpoint(tmp_path / "m", "qwen3")
    wrapper = load(path)
    inner = compat.hf_tokenizer(wrapper)
    assert isinstance(inner, transformers.PreTrainedTokenizerFast)
    assert inner.get_vocab() == wrapper.get_vocab()
    plain = object()
    assert compat.hf_tokenizer(plain) is plain  # an object without the wrapper's attribute passes through


def test_uvicorn_captured_signals_are_forgotten():
    import signal

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app=lambda *a: None))
    server.handle_exit(signal.SIGTERM, None)
    assert server._captured_signals == [signal.SIGTERM]
    compat.forget_captured_signals(server)
    assert server._captured_signals == []
    assert server.should_exit


def test_gemma4_make_masks_is_overridden_for_a_forward(tmp_path):
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(write_tiny_checkpoint(tmp_path / "g", "gemma4_text"))
    text_model = model.language_model.model if hasattr(model, "language_model") else model.model
    seen: list[int] = []

    def override(original):
        def make(h, cache):
            seen.append(h.shape[1])
            return original(h, cache)
        return make

    ids = mx.array([[1, 2, 3, 4]])
    want = model(ids, cache=make_prompt_cache(model))
    with compat.masks_overridden(text_model, override):
        got = model(ids, cache=make_prompt_cache(model))
    assert seen == [4]
    assert mx.allclose(got, want).item()
    model(ids, cache=make_prompt_cache(model))
    assert seen == [4]  # the override is gone
    assert "_make_masks" not in vars(text_model)


def test_lean_mlx_lm_skips_the_package_init_until_a_name_is_read():
    """After ``lean_mlx_lm()`` (what ``mlxrt serve`` runs first) an mlx-lm submodule imports
    without mlx_lm/__init__.py (which imports transformers); reading a name that file defines
    runs it then."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from mlxrt.compat import lean_mlx_lm\n"
        "lean_mlx_lm()\n"
        "import mlx_lm.models.cache, mlx_lm.sample_utils\n"
        "print('before', 'transformers' in sys.modules, 'mlx_lm.generate' in sys.modules)\n"
        "import mlx_lm\n"
        "from mlx_lm._version import __version__\n"
        "assert mlx_lm.__version__ == __version__\n"
        "from mlx_lm import load, stream_generate\n"
        "print('after', callable(load), callable(stream_generate), 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "before False False" in out.stdout
    assert "after True True True" in out.stdout


def test_defer_module_runs_the_module_at_the_first_read_of_one_of_its_names():
    """After ``defer_module("yaml")`` (what ``mlxrt serve`` runs first) ``import yaml`` — here
    Litestar's, at module level — binds the module without running it (LazyLoader would run it
    there); the first name read runs it, and ``from yaml import ...`` sees the real module."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from mlxrt.compat import defer_module\n"
        "module = defer_module('yaml')\n"
        "import litestar.openapi.plugins, yaml\n"
        "print('before', yaml is module, 'yaml.reader' in sys.modules, hasattr(yaml, '__wrapped__'))\n"
        "from yaml import safe_load\n"
        "print('after', safe_load('a: 1') == {'a': 1}, 'yaml.reader' in sys.modules, '__getattr__' in vars(yaml))\n"
        "print('again', defer_module('yaml'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["before True False False", "after True True False", "again None"], out.stdout


def test_mlx_lm_remappings_are_the_tables_mlx_lm_uses():
    from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING

    assert compat.mlx_lm_remappings() == (MODEL_REMAPPING, MODEL_ARCHITECTURE_REMAPPING)
    assert compat.mlx_lm_remappings()[0]["mistral"] == "llama"  # read from source, not a fallback


@pytest.fixture
def unreadable_mlx_lm_utils(tmp_path, monkeypatch):
    """mlx-lm as an upgrade might lay it out: a ``utils.py`` that no longer assigns the tables."""
    package = tmp_path / "mlx_lm"
    (package / "models").mkdir(parents=True)
    (package / "utils.py").write_text("MODEL_REMAPPING = dict(mistral='llama')\n")  # not a literal
    real = compat._mlx_lm_folder()
    (package / "models" / "llama.py").write_text((real / "models" / "llama.py").read_text())
    (package / "models" / "muse_spark.py").write_text((real / "models" / "muse_spark.py").read_text())
    monkeypatch.setattr(compat, "_mlx_lm_folder", lambda: package)
    compat.mlx_lm_remappings.cache_clear()
    yield
    compat.mlx_lm_remappings.cache_clear()


def test_mlx_lm_remappings_unreadable_leave_the_model_type_to_mlx_lm(tmp_path, unreadable_mlx_lm_utils):
    """When the tables cannot be read from source, a remapped type (``mistral`` → ``llama``) is
    loaded by mlx-lm's own loader (which knows its tables), not refused as unknown; the other
    readers of the tables answer from mlx-lm's imported module or defer to its loader."""
    import json

    from mlx_lm.models import llama

    from mlxrt.loading.weights import load_architecture_and_weights

    assert compat.mlx_lm_remappings() is None
    path = write_tiny_checkpoint(tmp_path / "m", "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    model, loaded = load_architecture_and_weights(path)
    assert type(model) is llama.Model and loaded["model_type"] == "mistral"
    assert compat.mlx_lm_has_architecture("mistral")  # from mlx_lm.utils, imported
    assert not compat.mlx_lm_has_architecture("no_such_model_type")
    assert compat.mlx_lm_sets_tokenizer_defaults("llama")  # cannot tell: mlx-lm's tokenizer loader decides


def test_mlx_lm_has_architecture_where_mlx_lm_finds_one():
    """A module per model type in ``mlx_lm/models``, or a ``MODEL_REMAPPING`` entry that names
    one: the same answer as importing the module mlx-lm would."""
    from mlx_lm.utils import MODEL_REMAPPING

    assert compat.mlx_lm_has_architecture("llama") and compat.mlx_lm_has_architecture("mistral")
    assert not compat.mlx_lm_has_architecture("no_such_model_type")
    assert importlib.import_module("mlx_lm.models.llama").__file__ == str(
        compat._mlx_lm_folder() / "models" / "llama.py")
    for model_type, module in MODEL_REMAPPING.items():
        found = importlib.util.find_spec(f"mlx_lm.models.{module}") is not None
        assert compat.mlx_lm_has_architecture(model_type) == found, model_type


def test_mlx_lm_tokenizer_defaults_are_read_where_mlx_lm_applies_them(tmp_path):
    """``TOKENIZER_DEFAULTS`` of a model module, read from source, is what mlx-lm's tokenizer
    loader (``mlx_lm.utils._tokenizer_defaults``) finds for a checkpoint of that type."""
    import json
    import sys

    from mlx_lm.utils import _tokenizer_defaults

    folder = compat._mlx_lm_folder() / "models"
    with_defaults = sorted(f.stem for f in folder.glob("*.py") if "TOKENIZER_DEFAULTS" in f.read_text())
    assert with_defaults, "no mlx-lm model module sets TOKENIZER_DEFAULTS any more"
    for model_type in (*with_defaults, "llama", "qwen3"):
        module = importlib.import_module(f"mlx_lm.models.{model_type}")
        assert compat.mlx_lm_sets_tokenizer_defaults(model_type) == hasattr(module, "TOKENIZER_DEFAULTS"), model_type
    path = write_tiny_checkpoint(tmp_path / "m", "llama")
    config = json.loads((path / "config.json").read_text())
    assert _tokenizer_defaults(path) is None
    module = sys.modules[f"mlx_lm.models.{with_defaults[0]}"]
    (path / "config.json").write_text(json.dumps({**config, "model_type": with_defaults[0]}))
    assert _tokenizer_defaults(path) == module.TOKENIZER_DEFAULTS  # (it finds the class, builds nothing)


def test_lean_litestar_keeps_litestar_default_plugins_but_pydantic():
    """Without pydantic imported, the app gets Litestar's default plugins less the pydantic
    ones (and pydantic stays unimported); with it imported, exactly Litestar's defaults."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from litestar import Litestar\n"
        "from mlxrt.compat import lean_litestar\n"
        "names = lambda app: sorted(type(p).__name__ for p in app.plugins)\n"
        "lean = names(lean_litestar()(route_handlers=[]))\n"
        "print('lean', lean, 'pydantic' in sys.modules)\n"
        "import pydantic\n"
        "print('with', names(lean_litestar()(route_handlers=[])) == names(Litestar(route_handlers=[])))\n"
        "full = names(Litestar(route_handlers=[]))\n"
        "print('rest', sorted(n for n in full if 'Pydantic' not in n) == lean)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lean = out.stdout.split("\n")[0]
    assert "AttrsSchemaPlugin" in lean and "MsgspecDIPlugin" in lean and "Pydantic" not in lean, lean
    assert lean.endswith("False")  # pydantic never imported
    assert "with True" in out.stdout and "rest True" in out.stdout


def test_litestar_handler_is_wrapped_outside_routing():
    """The wrapper sees a matched route, an unmatched path (404) and a CORS preflight, and its
    answer is what the client gets."""
    from litestar import Litestar, get
    from litestar.config.cors import CORSConfig
    from litestar.testing import TestClient

    @get("/here", sync_to_thread=False)
    def here() -> str:
        return "ok"

    app = Litestar(route_handlers=[here], cors_config=CORSConfig(allow_origins=["http://a.example"]))
    seen: list[tuple[str, str, int]] = []

    def wrap(handler):
        async def wrapped(scope, receive, send):
            async def sending(message):
                if message["type"] == "http.response.start":
                    seen.append((scope["method"], scope["path"], message["status"]))
                    message = {**message, "headers": [*message.get("headers", []), (b"x-wrapped", b"1")]}
                await send(message)

            await handler(scope, receive, sending)
        return wrapped

    compat.wrap_litestar_handler(app, wrap)
    with TestClient(app) as client:
        assert client.get("/here").headers["x-wrapped"] == "1"
        assert client.get("/nowhere").status_code == 404
        client.options("/here", headers={"origin": "http://a.example", "access-control-request-method": "GET"})
    assert [(m, p) for m, p, _ in seen] == [("GET", "/here"), ("GET", "/nowhere"), ("OPTIONS", "/here")]
    assert [status for *_, status in seen][:2] == [200, 404]


@pytest.mark.parametrize("implementation", ["auto", "h11"])
def test_uvicorn_protocol_state_is_read_as_a_request_arrives(implementation):
    """A connection of uvicorn's HTTP protocol (the one ``--http auto`` picks, and h11's) before
    its request head, with the head and part of the body, with the whole body, and answered."""
    import asyncio

    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.server import ServerState

    started = asyncio.Event()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        started.set()
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    class Transport(asyncio.Transport):
        def __init__(self):
            super().__init__()
            self.written, self.closing = b"", False

        def get_extra_info(self, name, default=None):
            return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 80)}.get(name, default)

        def write(self, data):
            self.written += data

        def is_closing(self):
            return self.closing

        def close(self):
            self.closing = True

        def pause_reading(self):
            pass

        def resume_reading(self):
            pass

    async def scenario():
        config = uvicorn.Config(app, log_config=None, lifespan="off")
        config.load()
        cls = compat.uvicorn_http_protocol() if implementation == "auto" else H11Protocol
        state = ServerState()
        protocol = cls(config=config, server_state=state, app_state={})
        transport = Transport()
        protocol.connection_made(transport)
        assert compat.uvicorn_connections(protocol) is state.connections and protocol in state.connections
        assert compat.uvicorn_loop(protocol) is asyncio.get_running_loop()
        assert compat.uvicorn_transport(protocol) is transport
        assert compat.uvicorn_request(protocol) is None
        protocol.data_received(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 4\r\n\r\nab")
        request = compat.uvicorn_request(protocol)
        assert request is not None
        assert compat.uvicorn_request_progress(request) == (True, False, False)
        scope = compat.uvicorn_request_scope(request)
        assert scope["path"] == "/x" and scope["method"] == "POST"
        await asyncio.wait_for(started.wait(), 5)
        protocol.data_received(b"cd")
        for _ in range(100):
            if compat.uvicorn_request_progress(request).response_complete:
                break
            await asyncio.sleep(0.01)
        assert compat.uvicorn_request_progress(request) == (False, True, True)
        assert transport.written.startswith(b"HTTP/1.1 200")
        protocol.connection_lost(None)
        assert protocol not in state.connections

    asyncio.run(scenario())


def test_no_module_but_compat_imports_a_private_of_the_fenced_dependencies():
    """Outside mlxrt.compat no module imports an underscored module or name of mlx, mlx-lm,
    uvicorn or Litestar, nor uvicorn's protocol classes, nor names an attribute the fence
    covers (``asgi_handler``, ``_captured_signals``, ``_make_masks``, ``_get_default_plugins``)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    fenced = {"mlx", "mlx_lm", "uvicorn", "litestar"}
    attributes = {"asgi_handler", "_captured_signals", "_make_masks", "_get_default_plugins"}
    found = []
    for folder in ("runtime", "api", "plugins", "families"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == root / "runtime" / "compat.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in fenced:
                    parts = node.module.split(".")
                    if (any(p.startswith("_") for p in parts) or any(a.name.startswith("_") for a in node.names)
                            or node.module.startswith("uvicorn.protocols")):
                        found.append(f"{path.relative_to(root)}:{node.lineno} from {node.module}")
                elif isinstance(node, ast.Import):
                    found += [f"{path.relative_to(root)}:{node.lineno} import {a.name}" for a in node.names
                              if a.name.split(".")[0] in fenced and any(p.startswith("_") for p in a.name.split("."))]
                elif isinstance(node, ast.Attribute) and node.attr in attributes:
                    found.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
    assert found == []


def test_mlx_lm_attention_is_routed_where_its_model_modules_call_it():
    # mlx-lm's model modules import base.scaled_dot_product_attention by name and call that global
    # (route_attention replaces it there); a module that stops doing so is found here first.
    import mlx.core as mx
    from mlx_lm.models import base, llama, qwen3

    for module in (llama, qwen3):  # mlx-lm's own, or (another test routed it) a route around it
        current = module.scaled_dot_product_attention
        assert getattr(current, "__wrapped__", current) is base.scaled_dot_product_attention
    args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                           num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=64)
    model = llama.Model(args)
    calls = []

    def route(original):
        def counted(*args, **kwargs):
            calls.append(1)
            return original(*args, **kwargs)
        return counted

    saved = llama.scaled_dot_product_attention
    try:
        llama.scaled_dot_product_attention = base.scaled_dot_product_attention
        assert compat.route_attention(model, route) == 1
        mx.eval(model(mx.array([[1, 2, 3]])))
        assert calls == [1]  # one layer, one call
    finally:
        llama.scaled_dot_product_attention = saved


@pytest.mark.parametrize(("module", "name"), sorted(compat.KNOWN_FORWARDS))
def test_mlx_lm_forward_is_the_one_mlxrt_recomputes(module, name):
    # mlxrt.engine.one_token and qmv.install_fused recompute this forward with fewer primitives;
    # an mlx-lm that changed it fails here by name (and the model's layers are left as mlx-lm's)
    cls = getattr(importlib.import_module(f"mlx_lm.models.{module}"), name)
    assert compat.mlx_lm_forward_known(cls), f"mlx_lm.models.{module}.{name}.__call__ changed"
    assert not compat.mlx_lm_forward_known(type(name, (cls,), {"__module__": cls.__module__,
                                                               "__call__": lambda self: None}))


@pytest.mark.parametrize("name", sorted(compat.KNOWN_CACHES))
def test_mlx_lm_cache_update_is_the_one_the_fused_decode_step_performs(name):
    from mlx_lm.models import cache

    cls = getattr(cache, name)
    assert compat.mlx_lm_cache_known(cls), f"mlx_lm.models.cache.{name}'s update changed"
    changed = type(name, (cls,), {"__module__": cls.__module__, "update_and_fetch": lambda self, k, v: (k, v)})
    assert not compat.mlx_lm_cache_known(changed)
