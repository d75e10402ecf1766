"""A third-party dialect: ``POST /v1/plain``, one user text in, one text out.

Everything between decoding and encoding (model choice, limits, sampling, stops, canonicalize,
prepare, the engine, the assembler) is mlxrt's pipeline: the dialect only says what its wire
looks like.
"""

from __future__ import annotations

from mlxrt import hookimpl

MLXRT_PLUGIN_KIND = "dialect"


@hookimpl
def mlxrt_routes(host):
    from mlxrt_dialect_example.routes import ROUTES

    return ROUTES


@hookimpl
def mlxrt_request_fields(dialect):
    # A field of our own dialect, claimed like any plugin's: it reaches options.extra.
    return {"tag": str} if dialect == "plain" else None
