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


def test_batch_generator_batches_are_found_by_their_cache(tmp_path):
    """Every model call of mlx-lm's BatchGenerator (prefill chunks, the split into
    generation, decode steps) is matched to its rows, in row order."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.utils import load_model

    model, _ = load_model(write_tiny_checkpoint(tmp_path / "q", "qwen3"))
    calls: list[tuple[int, list[int] | None]] = []

    class Recording:
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, inputs, *args, cache=None, **kwargs):
            calls.append((inputs.shape[0], compat.batch_uids(gen, cache)))
            return model(inputs, *args, cache=cache, **kwargs)

    gen = BatchGenerator(Recording(), completion_batch_size=4, prefill_batch_size=4, prefill_step_size=4)
    uids = gen.insert([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]], max_tokens=[3, 3])
    later = gen.insert([[5]], max_tokens=[2])
    for _ in range(12):
        gen.next()
    gen.close()
    assert calls
    for rows, found in calls:
        assert found is not None and len(found) == rows
        assert set(found) <= set(uids) | set(later)
    assert any(len(found) == 2 for _, found in calls)  # the two joined one batch
    assert [uids[0]] in [found for _, found in calls]  # the short prompt split off alone
