"""Fault isolation in the batch lane, through a served model and the official openai client: a
model error in one request's prefill fails that request only (with the error the serial lane
gives it), a failing batched decode step fails the requests of that step and no other, and the
server keeps serving. The faults come from a test plugin whose ``mlxrt_load_model`` wraps the
tiny checkpoint's model (see :class:`FaultyModel`)."""

from __future__ import annotations

import concurrent.futures as cf
import time

import openai
import pytest
from support import openai_client

from mlxrt import hookimpl

pytest.importorskip("mlx_lm")

POISON = " xylophone"  # a prompt holding this word fails in its prefill
TRIGGER = "trombone"  # when armed, a prefill chunk holding this word makes the next decode step fail
GOOD = ["tell me about the sea", "one two three four", "the weather in Paris"]
LATE = "trombone music: a story about a cat and a long walk by the sea"  # 30 tokens: 4 chunks of 8
STEP_DELAY = 0.03  # each decode step, so that requests overlap for certain


def _holds(ids: list[int], part: list[int]) -> bool:
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))


class FaultyModel:
    """Loads the model as mlx-lm does, then: a prefill chunk holding the token ids of
    :data:`POISON` raises; every decode step takes :data:`STEP_DELAY` longer; and once
    ``armed``, a prefill chunk holding :data:`TRIGGER` makes the next decode step raise."""

    def __init__(self) -> None:
        self.poison: list[int] = []
        self.trigger: list[int] = []
        self.armed = False
        self.explode = False

    @hookimpl(tryfirst=True)
    def mlxrt_load_model(self, info, host):
        from tokenizers import Tokenizer

        from mlxrt.loading import mlx_lm_load

        tokenizer = Tokenizer.from_file(str(info.path / "tokenizer.json"))
        self.poison = tokenizer.encode(POISON, add_special_tokens=False).ids
        self.trigger = tokenizer.encode(TRIGGER, add_special_tokens=False).ids
        loaded = mlx_lm_load(info)
        plugin, base = self, type(loaded.model)

        class Faulty(base):  # the same module with its call wrapped (isinstance checks still hold)
            def __call__(self, inputs, *args, **kwargs):
                if inputs.shape[1] > 1:  # a prefill chunk (decode steps feed one token per row)
                    ids = inputs.tolist()[0]
                    if _holds(ids, plugin.poison):
                        raise RuntimeError("poisoned prefill")
                    if plugin.armed and _holds(ids, plugin.trigger):
                        plugin.armed, plugin.explode = False, True
                else:
                    time.sleep(STEP_DELAY)
                    if plugin.explode:
                        plugin.explode = False
                        raise RuntimeError("decode step exploded")
                return base.__call__(self, inputs, *args, **kwargs)

        loaded.model.__class__ = Faulty
        return loaded


@pytest.fixture
def served(mlxrt_tiny_checkpoint, mlxrt_serve):
    plugin = FaultyModel()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("faulty", plugin)],
                       options={"prompt_cache_size": 0, "prefill_step_size": 8})
    return client, plugin


def _complete(client, prompt: str, **kw) -> str:
    return openai_client(client).completions.create(model="m", prompt=prompt, max_tokens=kw.pop("max_tokens", 24),
                                                    temperature=0, **kw).choices[0].text


def _engine(client) -> dict:
    return client.get("/stats").json()["engine"]


def _outcome(client, prompt: str, **kw):
    try:
        return _complete(client, prompt, **kw)
    except openai.APIStatusError as exc:
        return exc


def _while_good_run(client, late: tuple[str, dict]) -> tuple[list, object]:
    """Run the GOOD prompts together and, once all three are running, ``late`` (prompt, kwargs)."""
    with cf.ThreadPoolExecutor(4) as pool:
        good = [pool.submit(_outcome, client, p) for p in GOOD]
        deadline = time.monotonic() + 30
        while _engine(client)["running_rows"] < len(GOOD):
            assert time.monotonic() < deadline, "the three requests never ran together"
            time.sleep(0.01)
        last = pool.submit(_outcome, client, late[0], **late[1])
        return [f.result() for f in good], last.result()


def test_a_failing_prefill_fails_only_its_request_with_the_serial_lanes_error(served):
    client, _ = served
    alone = [_complete(client, p) for p in GOOD]
    poisoned = f"{POISON}, please play it for me"  # the word in its first prefill chunk
    with pytest.raises(openai.InternalServerError) as serial:  # alone: the serial lane runs it
        _complete(client, poisoned)
    assert "generation failed: RuntimeError: poisoned prefill" in serial.value.message
    before = _engine(client)["served_by_lane"]["batch"]

    good, failed = _while_good_run(client, (poisoned, {}))

    assert isinstance(failed, openai.InternalServerError), failed
    assert failed.body == serial.value.body  # the same JSON error as in the serial lane
    assert good == alone  # the other rows went on, unchanged, and saw no error
    stats = _engine(client)
    assert stats["served_by_lane"]["batch"] == before + 4  # the failed one ended in the batch lane too
    assert stats["running_rows"] == 0
    assert _complete(client, GOOD[0]) == alone[0]  # and the server keeps serving


def test_a_failing_decode_step_fails_the_requests_in_it_and_no_other(served):
    client, plugin = served
    alone = _complete(client, GOOD[0])
    late_alone = _complete(client, LATE)
    plugin.armed = True  # LATE's first prefill chunk makes the next decode step fail

    good, late = _while_good_run(client, (LATE, {}))

    assert not plugin.armed and not plugin.explode  # the step did fail
    # the three decoding rows shared the failed model call: each gets the error, none a text
    for result in good:
        assert isinstance(result, openai.InternalServerError), result
        assert "generation failed: RuntimeError: decode step exploded" in result.message
    # LATE was still prefilling on a cache of its own: it runs on to its own text
    assert late == late_alone
    assert _engine(client)["running_rows"] == 0
    assert _complete(client, GOOD[0]) == alone  # and the server keeps serving
