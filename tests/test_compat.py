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
    """After ``import mlxrt`` an mlx-lm submodule imports without mlx_lm/__init__.py (which
    imports transformers); reading a name that file defines runs it then."""
    import subprocess
    import sys

    script = (
        "import sys, mlxrt\n"
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


def test_mlx_lm_remappings_are_the_tables_mlx_lm_uses():
    from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING

    assert compat.mlx_lm_remappings() == (MODEL_REMAPPING, MODEL_ARCHITECTURE_REMAPPING)
    assert compat.mlx_lm_remappings()[0]  # read from source, not an empty fallback


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
