"""The family conformance runner for plugin authors: :func:`check_family` serves a tiny
checkpoint of a family in process, with the author's plugins registered, and checks what a
family plugin promises (docs/plugins/writing-a-plugin.md):

* ``template``: the chat template renders a user turn with a generation prompt;
* ``tools`` / ``tool_result``: an assistant tool call renders and the family's tool parser
  reads it back (name and typed arguments), and a tool result renders after it;
* ``thinking``: a turn with reasoning renders and the reasoning splitter reads it back;
* ``parity``: greedy completions equal mlx-lm's ``generate`` on the same checkpoint (only
  for checkpoints mlx-lm loads itself; a family with its own loader reports ``n/a``).

The first four are the load-time self-test (:mod:`mlxrt.loading.self_test`) as ``/stats`` reports it;
each is ``"pass"``, ``"n/a"`` (the family claims no such capability) or ``"fail: why"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["FamilyCheck", "check_family", "served"]

PARITY_PROMPT = "The capital of France is"


@attrs.frozen
class FamilyCheck:
    """What :func:`check_family` found.

    :ivar model_type: The checkpoint's family (``mlxrt.testing.TINY_MODEL_TYPES``).
    :ivar results: Check name → ``"pass"``, ``"n/a"`` or ``"fail: why"``.
    :ivar provenance: Family aspect → the plugin that answered it (as ``/stats`` reports).
    """

    model_type: str
    results: Mapping[str, str]
    provenance: Mapping[str, str]

    @property
    def failures(self) -> dict[str, str]:
        return {name: result for name, result in self.results.items() if result != "pass" and result != "n/a"}


@contextlib.contextmanager
def served(model: str | Path, *, plugins: Sequence[object] = (), options: Mapping[str, Any] | None = None,
           disable: Collection[str] = ()) -> Iterator[Any]:
    """The whole app for ``model`` in process, as a Litestar ``TestClient``, with ``plugins``
    registered before the installed ones; any ``model`` name in a body reaches the served model."""
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    host = make_host(extra=plugins, disable=disable)
    app = build_server(host, str(model), {"host": "127.0.0.1", "port": 0, "model_fallback": True,
                                          **(options or {})})
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:  # a Host the loopback server serves
            yield client
    finally:
        app.state.models.stop()


def check_family(model_type: str, *, plugins: Sequence[object] = (), checkpoint: str | Path | None = None,
                 workdir: str | Path, expect: Collection[str] = (), max_tokens: int = 8) -> FamilyCheck:
    """Run the conformance checks for ``model_type`` and raise ``AssertionError`` naming every
    failure; returns the :class:`FamilyCheck` when all pass.

    :param plugins: The plugins under test, registered before the installed ones.
    :param checkpoint: A checkpoint folder to serve; by default a tiny random one of
        ``model_type`` is written under ``workdir``.
    :param workdir: A folder for the checkpoint (pytest's ``tmp_path``).
    :param expect: Checks that must ``"pass"`` (``"tools"``, ``"thinking"``…): ``"n/a"`` is a
        failure for them. ``template`` is always expected.
    :param max_tokens: Greedy tokens compared with mlx-lm.
    """
    from mlxrt.testing.writers import write_tiny_checkpoint

    path = Path(checkpoint) if checkpoint is not None else write_tiny_checkpoint(
        Path(workdir) / f"conformance-{model_type}", model_type)
    with served(path, plugins=plugins) as client:
        stats = client.get("/stats").json()["model"]
        results = dict(stats["self_test"])
        provenance = dict(stats["provenance"])
        if provenance.get("load_model", "mlx-lm") != "mlx-lm":  # a plugin loads it: no mlx-lm to compare with
            results["parity"] = "n/a"
        else:
            body = {"model": "m", "prompt": PARITY_PROMPT, "max_tokens": max_tokens, "temperature": 0}
            ours = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
            theirs = _mlx_lm_greedy(path, PARITY_PROMPT, max_tokens)
            results["parity"] = "pass" if ours == theirs else f"fail: mlxrt {ours!r} != mlx-lm {theirs!r}"
    for name in ("template", *expect):
        if results.get(name, "n/a") == "n/a":
            results[name] = "fail: expected to pass, is n/a"
    check = FamilyCheck(model_type=model_type, results=results, provenance=provenance)
    if check.failures:
        lines = "\n".join(f"  {name}: {why}" for name, why in check.failures.items())
        raise AssertionError(f"family {model_type!r} does not conform:\n{lines}")
    return check


def _mlx_lm_greedy(path: Path, prompt: str, max_tokens: int) -> str:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(path))
    return mlx_lm.generate(model, tokenizer, prompt=prompt, max_tokens=max_tokens, sampler=make_sampler(temp=0.0))
