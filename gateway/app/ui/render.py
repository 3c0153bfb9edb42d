"""Turning a page's data into HTML: the templates, the navigation, flash messages, error
pages and pagination links, shared by every page module.

:func:`render` adds what ``base.html`` needs to every page's context (``operator``,
``csrf_token``, ``nav``, ``active``, ``flash``) and what the role allows (``may_write``,
``may_keys``, ``may_own``: templates show a control only to a role that may use it), so a page
module passes only its own data.
Templates are autoescaped: a tenant named ``<script>`` is shown, never run.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.templating import Jinja2Templates

from admin_ui import TEMPLATES_DIR
from gateway.app.admin.roles import Access, Principal
from gateway.app.state import get_state

__all__ = [
    "NAV",
    "NavItem",
    "Pager",
    "error_page",
    "fmt",
    "pager",
    "redirect",
    "render",
    "templates",
]

UI_PATH = "/ui"
FLASH_COOKIE = "tiergate_flash"
_FLASH_LABEL = b"tiergate flash v1:"
MAX_FLASH = 300


@dataclass(frozen=True, slots=True)
class NavItem:
    key: str
    label: str
    href: str
    access: Access = Access.READ
    """Who sees the link: the level its page's rule asks (:mod:`gateway.app.ui.rules`)."""


NAV = (
    NavItem("overview", "Overview", f"{UI_PATH}/"),
    NavItem("usage", "Usage", f"{UI_PATH}/usage", Access.TENANT_READ),
    NavItem("requests", "Requests", f"{UI_PATH}/requests", Access.TENANT_READ),
    NavItem("budgets", "Budgets", f"{UI_PATH}/budgets", Access.TENANT_READ),
    NavItem("tiers", "Tiers", f"{UI_PATH}/tiers"),
    NavItem("tenants", "Tenants", f"{UI_PATH}/tenants"),
    NavItem("keys", "Keys", f"{UI_PATH}/keys", Access.TENANT_READ),
    NavItem("backends", "Backends", f"{UI_PATH}/backends"),
    NavItem("profiles", "Profiles", f"{UI_PATH}/profiles"),
    NavItem("prices", "Prices", f"{UI_PATH}/prices"),
    NavItem("audit", "Audit", f"{UI_PATH}/audit"),
    NavItem("operators", "Operators", f"{UI_PATH}/operators"),
    NavItem("api", "API reference", "/docs", Access.ANY),
)
"""The dashboard's navigation, in the contract's order (``base.html`` renders the links the
signed-in operator's role opens)."""


def home_of(principal: Principal | None) -> str:
    """Where a signed-in operator starts: the overview, or a tenant admin's keys."""
    if principal is not None and not principal.may(Access.READ):
        return f"{UI_PATH}/keys"
    return f"{UI_PATH}/"


def _role_context(principal: Principal | None) -> dict[str, Any]:
    """What the templates need to show only the controls the role may use."""
    return {
        "nav": [i for i in NAV if principal is None or principal.may(i.access)],
        "home": home_of(principal),
        "who": principal,
        "may_write": principal is not None and principal.may(Access.WRITE),
        "may_keys": principal is not None and principal.may(Access.TENANT_WRITE),
        "may_own": principal is not None and principal.may(Access.OWNER),
    }


def fmt(value: Any, digits: int = 3) -> str:
    """A value for a table cell: numbers without noise, times in UTC to the second, "—" for
    nothing (an unset limit is "—", which the column header says means unlimited)."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def money(value: Decimal | None) -> str:
    """An amount to six decimals, grouped (a millionth is the finest a price is set in)."""
    if value is None:
        return "—"
    return f"{value.quantize(Decimal('0.000001')):,f}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = fmt
    env.filters["percent"] = percent
    env.filters["money"] = money
    return env


templates = Jinja2Templates(env=_environment())
"""The dashboard's templates (``admin_ui/templates``); other page modules render through
:func:`render`, or use this directly for a partial."""


# ---- flash messages: one line shown on the next page, carried in a signed cookie ----------


def _flash_signature(request: Request, message: bytes) -> str:
    secret = get_state(request).secret
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, _FLASH_LABEL + message, hashlib.sha256).hexdigest()[:32]


def _flash_value(request: Request, message: str) -> str:
    raw = message[:MAX_FLASH].encode()
    encoded = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"{encoded}.{_flash_signature(request, raw)}"


def take_flash(request: Request) -> str | None:
    """The flash message the previous response left, if its signature holds (no one else can
    make the dashboard show a message of their choosing)."""
    value = request.cookies.get(FLASH_COOKIE)
    if not value or "." not in value:
        return None
    encoded, _, signature = value.rpartition(".")
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(signature, _flash_signature(request, raw)):
        return None
    return raw.decode(errors="replace")


def redirect(request: Request, url: str, *, flash: str | None = None) -> RedirectResponse:
    """303 to ``url`` (POST, then GET), with ``flash`` shown once on the page it lands on."""
    response = RedirectResponse(url, status_code=303)
    if flash:
        response.set_cookie(
            FLASH_COOKIE,
            _flash_value(request, flash),
            path=UI_PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


# ---- pages --------------------------------------------------------------------------------


def render(
    request: Request,
    template: str,
    *,
    status_code: int = 200,
    active: str | None = None,
    headers: Mapping[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """``template`` with ``context`` and what ``base.html`` needs: the signed-in operator (or
    None), their CSRF token, the navigation with ``active`` marked, and a flash message."""
    operator = getattr(request.state, "operator", None)
    flash = take_flash(request)
    values = {
        "operator": operator,
        "csrf_token": operator.csrf_token if operator is not None else "",
        **_role_context(operator.principal if operator is not None else None),
        "active": active,
        "flash": flash,
        "errors": {},
        **context,
    }
    response = templates.TemplateResponse(
        request, template, values, status_code=status_code, headers=headers
    )
    if request.cookies.get(FLASH_COOKIE) is not None:
        response.delete_cookie(FLASH_COOKIE, path=UI_PATH)
    return response


def error_page(
    request: Request,
    status_code: int,
    message: str,
    *,
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> HTMLResponse:
    """A deliberate error page: what went wrong, in the API's words, with a way back."""
    default = {
        400: "Invalid request",
        403: "Refused",
        404: "Not found",
        409: "Conflict",
        429: "Too many attempts",
        503: "Database unavailable",
    }
    return render(
        request,
        "error.html",
        status_code=status_code,
        headers=headers,
        title=title or default.get(status_code, "Error"),
        message=message,
        status=status_code,
    )


# ---- pagination ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pager:
    """A list page's place in its list, for ``partials/pager.html``."""

    total: int
    limit: int
    offset: int
    shown: int
    prev_url: str | None
    next_url: str | None

    @property
    def first(self) -> int:
        return self.offset + 1 if self.shown else 0

    @property
    def last(self) -> int:
        return self.offset + self.shown


def page_url(request: Request, **changes: Any) -> str:
    """This page's URL with query parameters changed (None drops one)."""
    params = {k: v for k, v in request.query_params.items() if k not in changes}
    params.update({k: str(v) for k, v in changes.items() if v is not None})
    query = urlencode(params)
    return f"{request.url.path}?{query}" if query else request.url.path


def pager(request: Request, *, total: int, limit: int, offset: int, shown: int) -> Pager:
    """Prev/next links that keep the page's filters."""
    prev_url = page_url(request, offset=max(0, offset - limit) or None) if offset > 0 else None
    next_url = page_url(request, offset=offset + limit) if offset + limit < total else None
    return Pager(total, limit, offset, shown, prev_url, next_url)
