"""The API reference (``/docs``, ``/redoc``) from vendored assets, so it works without internet.

FastAPI's own ``/docs`` loads Swagger UI's script and stylesheet from a CDN: a site without
internet access got a blank page. Here the page references only this gateway: the assets of
``swagger-ui-dist`` vendored in :mod:`admin_ui` (``admin_ui/VENDORED.md``: version, licence,
the command that fetched them) at ``/docs/assets``, and the app's ``/openapi.json``. It does
not depend on the dashboard being on (``/ui/static`` is the dashboard's).

``/redoc`` is ReDoc's standalone bundle, vendored the same way (``redoc`` from npm) at
``/redoc/assets``, without FastAPI's Google Fonts link. The bundle itself names one file on a
CDN (its footer's logo), so the page is served with a content security policy that lets the
browser load this gateway's files only (and ReDoc's own inline styles, ``blob:`` worker and
``data:`` images).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from admin_ui import STATIC_DIR

__all__ = ["ASSETS_PATH", "DOCS_PATH", "REDOC_DIR", "REDOC_PATH", "SWAGGER_UI_DIR", "install_docs"]

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
OAUTH2_REDIRECT_PATH = "/docs/oauth2-redirect"
SWAGGER_UI_DIR = STATIC_DIR / "vendor" / "swagger-ui"
REDOC_PATH = "/redoc"
REDOC_ASSETS_PATH = "/redoc/assets"
REDOC_DIR = STATIC_DIR / "vendor" / "redoc"
REDOC_POLICY = (
    "default-src 'self'; script-src 'self'; worker-src 'self' blob:; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'"
)

SWAGGER_UI_PARAMETERS = {
    # Swagger UI would otherwise send the document to validator.swagger.io for a badge
    "validatorUrl": None,
    "persistAuthorization": False,  # no key kept in the browser's storage
}


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` (and its OAuth2 redirect) and the Swagger UI assets; the app must be
    made with ``docs_url=None, redoc_url=None`` so that FastAPI's CDN pages are not served."""
    app.mount(ASSETS_PATH, StaticFiles(directory=SWAGGER_UI_DIR), name="docs-assets")
    app.mount(REDOC_ASSETS_PATH, StaticFiles(directory=REDOC_DIR), name="redoc-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} — API reference",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_PATH}",
            init_oauth=app.swagger_ui_init_oauth,
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} — API reference",
            redoc_js_url=f"{root}{REDOC_ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
            with_google_fonts=False,
        )
        page.headers["content-security-policy"] = REDOC_POLICY
        return page

    @app.get(OAUTH2_REDIRECT_PATH, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
