"""A third-party sampler plugin: always emit the k-th most likely token (0 = greedy).

``k`` comes from the request's ``sample_rank`` field, else from ``mlxrt serve --sample-rank``;
with neither, the plugin leaves sampling alone. Its effect is exact and easy to check, which
is why mlxrt's tests install it: it proves a separately installed package changes sampling
through the public hooks alone.
"""

from __future__ import annotations

from mlxrt import hookimpl
from mlxrt.errors import InvalidRequest

MLXRT_PLUGIN_KIND = "sampler"


@hookimpl
def mlxrt_serve_options():
    import click

    return [click.Option(["--sample-rank"], type=click.IntRange(min=0), default=None,
                         help="Always pick the k-th most likely token (0 = greedy).")]


@hookimpl
def mlxrt_request_fields(dialect):
    return {"sample_rank": int} if dialect == "openai" else None


@hookimpl
def mlxrt_sampler(request, host):
    rank = request.extra.get("sample_rank", host.options.get("sample_rank"))
    if rank is None:
        return None
    if rank < 0:
        raise InvalidRequest("sample_rank must be at least 0", param="sample_rank")
    import mlx.core as mx

    def sample(logprobs):
        order = mx.argsort(-logprobs, axis=-1)
        return order[:, min(rank, logprobs.shape[-1] - 1)]

    return sample
