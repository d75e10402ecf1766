"""The pages under ``/schema`` served offline, and the server's favicon.

Litestar's default ``/schema`` page is Redoc from a CDN, with web fonts and an image from two
more: blank without the network, and every view told three third parties about it. Here the
page is Swagger UI, its script and stylesheet served by the server itself from the
``swagger-ui-bundle-v2`` package (Swagger UI's own release files); the page links nothing
outside the server. ``/favicon.ico`` answers the request every browser page makes (it was a
404 on each page load).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from mlxrt.errors import NotFound

__all__ = ["render_plugins", "SCHEMA_ROUTES", "ASSETS", "FAVICON_SVG"]

#: Swagger UI's files the page loads, by name → media type (nothing else is served).
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "swagger-ui.css": "text/css",
}
_PREFIX = "/schema/assets"
_PUBLIC = {"public": True}  # a browser loads them without the API key, like the pages
#: A small mark in the pages' colours: a rounded square with "mx".
FAVICON_SVG = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
               b'<rect width="32" height="32" rx="6" fill="#1f4e79"/>'
               b'<text x="16" y="21" font-family="sans-serif" font-size="13" font-weight="bold" '
               b'text-anchor="middle" fill="#fff">mx</text></svg>')
_ICON_LINK = "<link rel='icon' type='image/svg+xml' href='/favicon.ico'>"


def render_plugins() -> list[Any]:
    """Swagger UI at ``/schema`` (and ``/schema/swagger``), its files from this server; the
    document as ``/schema/openapi.json`` and ``/schema/openapi.yaml`` (``.yml``). Litestar's
    other pages (``redoc``, ``elements``, ``rapidoc``) load from CDNs and are not served."""
    from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin, YamlRenderPlugin

    return [SwaggerRenderPlugin(js_url=f"{_PREFIX}/swagger-ui-bundle.js", css_url=f"{_PREFIX}/swagger-ui.css",
                                standalone_preset_js_url=f"{_PREFIX}/swagger-ui-standalone-preset.js",
                                path=["/", "/swagger"], favicon=_ICON_LINK),
            JsonRenderPlugin(), YamlRenderPlugin()]


@get(f"{_PREFIX}/{{name:str}}", include_in_schema=False, opt=_PUBLIC, sync_to_thread=False)
def schema_asset(request: Request[Any, Any, Any]) -> Response[Any]:
    """One of Swagger UI's files (:data:`ASSETS`), read from the swagger-ui-bundle-v2 package."""
    from pathlib import Path

    name = str(request.path_params["name"])
    media = ASSETS.get(name)
    if media is None:
        raise NotFound(f"no schema asset named {name!r}")
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:  # a dependency of mlxrt; an install without it gets the JSON only
        raise NotFound("the /schema page needs the swagger-ui-bundle-v2 package; /schema/openapi.json "
                       "is served without it") from None
    return Response(content=(Path(swagger_ui_path) / name).read_bytes(), media_type=media,
                    headers={"Cache-Control": "max-age=86400"})


@get("/favicon.ico", include_in_schema=False, opt=_PUBLIC, sync_to_thread=False)
def favicon() -> Response[Any]:
    return Response(content=FAVICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


SCHEMA_ROUTES = (schema_asset, favicon)
