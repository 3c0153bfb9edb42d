"""``/ui/profiles``: the latency profiles backends can name — shipped and stored — one viewed
whole, a profile JSON imported from an upload, a stored one deleted.

The same crud calls and checks as ``/admin/v1/profiles``: an upload is read as the API's
``ProfileImport`` body (its document, an optional name), then
:func:`gateway.db.crud.import_profile` validates the document as ``tiergate profile fit``
writes it. A refusal is shown beside the field it names, in the API's words.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from gateway.app.admin.helpers import delete_row, resolve
from gateway.app.admin.schemas import ProfileImport
from gateway.app.ui.deps import (
    ChangeDep,
    CsrfDep,
    Operator,
    OperatorDep,
    PageDep,
    SessionDep,
    UiRoute,
)
from gateway.app.ui.forms import FORM_ERROR, attempt, field_errors, validate
from gateway.app.ui.render import pager, redirect, render
from gateway.db import crud
from gateway.db.models import Backend
from gateway.errors import ApiError, nul_character

router = APIRouter(route_class=UiRoute)

FIELDS = ("document", "name")
MAX_UPLOAD_BYTES = 512 * 1024
"""A profile is a few KiB of JSON; the app's body limit bounds the request anyway."""


@router.get("/profiles")
def list_profiles(
    request: Request, operator: OperatorDep, session: SessionDep, page: PageDep
) -> Response:
    catalog = crud.profile_catalog(session)
    used: dict[str, int] = {}
    for profile in session.scalars(select(Backend.profile)):
        used[profile] = used.get(profile, 0) + 1
    rows = catalog[page.offset : page.offset + page.limit]
    return render(
        request,
        "profiles.html",
        active="profiles",
        title="Profiles",
        profiles=rows,
        used=used,
        pager=pager(
            request, total=len(catalog), limit=page.limit, offset=page.offset, shown=len(rows)
        ),
    )


def _import_form(
    request: Request,
    *,
    values: dict[str, Any] | None = None,
    errors: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    return render(
        request,
        "profile_import.html",
        status_code=status_code,
        active="profiles",
        title="Import a profile",
        values=values or {},
        errors=errors or {},
    )


@router.get("/profiles/-/import")
def import_form(request: Request, operator: OperatorDep) -> Response:
    return _import_form(request)


class _Refused(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


async def _upload(request: Request) -> tuple[Any, str | None]:
    """The uploaded document (parsed JSON) and the name typed, or :class:`_Refused`."""
    form = await request.form()
    name_field = form.get("name")
    name = name_field.strip() if isinstance(name_field, str) else ""
    if "\x00" in name:
        raise nul_character("name")
    upload = form.get("document")
    if not isinstance(upload, UploadFile) or not upload.filename:
        raise _Refused("document", "document: choose a profile JSON file to upload")
    raw = await upload.read(MAX_UPLOAD_BYTES + 1)
    if len(raw) > MAX_UPLOAD_BYTES:
        raise _Refused("document", f"document: larger than {MAX_UPLOAD_BYTES // 1024} KiB")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Refused("document", f"document: {upload.filename} is not JSON ({exc})") from None
    return document, name or None


def _import(session: Session, operator: Operator, body: ProfileImport) -> str:
    with session.begin():
        row = crud.import_profile(session, body.document, actor=operator.actor, name=body.name)
        return row.name


@router.post("/profiles/-/import")
async def import_profile(
    request: Request, operator: OperatorDep, _: CsrfDep, session: SessionDep
) -> Response:
    try:
        document, name = await _upload(request)
    except _Refused as refused:
        form = await request.form()
        typed = form.get("name")
        values = {"name": typed if isinstance(typed, str) else ""}
        return _import_form(
            request, values=values, errors={refused.field: refused.message}, status_code=400
        )
    values = {"name": name or ""}
    body: dict[str, Any] = {"document": document}
    if name is not None:
        body["name"] = name

    def change() -> str:
        return _import(session, operator, validate(ProfileImport, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        errors = field_errors(result, FIELDS)
        if FORM_ERROR in errors and result.param not in FIELDS:
            # the data layer names the profile ("latency_profile") or a document field
            errors = {"document": errors[FORM_ERROR]}
        return _import_form(request, values=values, errors=errors, status_code=result.status)
    return redirect(request, f"/ui/profiles/{result}", flash=f"Profile {result} imported.")


@router.get("/profiles/{name}")
def view_profile(
    request: Request, name: str, operator: OperatorDep, session: SessionDep
) -> Response:
    entry = resolve(crud.get_profile_entry, session, name)
    users = list(
        session.scalars(
            select(Backend.name).where(Backend.profile == entry.name).order_by(Backend.name)
        )
    )
    return render(
        request,
        "profile.html",
        active="profiles",
        title=f"Profile {entry.name}",
        entry=entry,
        users=users,
        document=json.dumps(entry.profile.to_dict(), indent=2, sort_keys=True),
    )


@router.post("/profiles/{name}/delete")
async def delete_profile(name: str, change: ChangeDep) -> Response:
    """A profile in use, shipped, or gone is refused with the API's status and words, on a
    page (the route turns the refusal into it)."""

    def remove() -> str:
        session = change.session
        with session.begin():
            row = resolve(crud.get_deletable_profile, session, name)
            actor = change.operator.actor
            return delete_row(
                session, actor, crud.delete_profile, "latency_profile", row.id, row.name
            ).name

    deleted = await run_in_threadpool(remove)
    return redirect(change.request, "/ui/profiles", flash=f"Profile {deleted} deleted.")
