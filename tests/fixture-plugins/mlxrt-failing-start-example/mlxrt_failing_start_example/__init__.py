"""Two deliberately failing plugins: one whose ``mlxrt_routes`` raises, one whose
``mlxrt_startup`` raises (its route must then answer 503, not serve)."""

from litestar import get

from mlxrt import hookimpl


@get("/badstart")
async def badstart_route() -> dict:
    return {"served": True}


class _BadRoutes:
    @hookimpl
    def mlxrt_routes(self, host):
        raise RuntimeError("routes broken on purpose")


class _BadStartup:
    @hookimpl
    def mlxrt_routes(self, host):
        return [badstart_route]

    @hookimpl
    def mlxrt_startup(self, host):
        raise RuntimeError("startup broken on purpose")


BAD_ROUTES = _BadRoutes()
BAD_STARTUP = _BadStartup()
