"""The create / edit / delete flow of a dashboard table page, written once.

Every table page does the same: read the form as text, turn it into the JSON the admin API
would get (:func:`~gateway.app.ui.forms.convert`), validate it with the API's own model, make
the change in one transaction in the thread pool (crud blocks), then redirect with a flash, or
show the form again with what was typed, the refusal beside its field and the API's status.
One copy keeps the pages from drifting apart in how they refuse. A page module declares its
table as a :class:`Resource` and passes only what is its own: how a row is written when crud's
call is not enough, and what a committed change must reload or invalidate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.helpers import (
    change_and_invalidate,
    delete_row,
    invalidate,
    patch_row,
    resolve,
)
from gateway.app.ui.deps import Change
from gateway.app.ui.forms import (
    FORM_ERROR,
    Kind,
    attempt,
    convert,
    field_errors,
    input_text,
    read_form,
)
from gateway.app.ui.forms import validate as validated
from gateway.app.ui.render import redirect, render
from gateway.errors import ApiError

__all__ = ["After", "Resource", "Saved", "commit_and_invalidate", "submit"]


class _Row(Protocol):
    """A named, versioned table row (a tier, a tenant, a backend)."""

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def updated_at(self) -> datetime: ...


RowT = TypeVar("RowT", bound=_Row)
ModelT = TypeVar("ModelT", bound=BaseModel)
ResultT = TypeVar("ResultT")
ChangedT = TypeVar("ChangedT")
OutT = TypeVar("OutT")

After = Callable[[], Awaitable[None]]
"""A side effect once a change is committed that must run on the event loop (a pool reload)."""


class Saved(NamedTuple):
    """An edit's outcome: the row's name afterwards, and whether anything was written."""

    name: str
    changed: bool


async def submit(
    change: Change,
    fields: Mapping[str, Kind],
    model: type[ModelT],
    write: Callable[[ModelT], ResultT],
    *,
    blank_is_null: bool,
    required: Iterable[str] = (),
) -> tuple[dict[str, str], ResultT | ApiError]:
    """The form as typed, and ``write``'s result for it or the API's refusal: the body is
    validated by the API's ``model`` and written in the thread pool."""
    values = await read_form(change.request)
    body = convert(values, fields, blank_is_null=blank_is_null, required=required)
    result = await run_in_threadpool(attempt, lambda: write(validated(model, body)))
    return values, result


async def commit_and_invalidate(
    change: Change,
    write: Callable[[Session], ChangedT],
    present: Callable[[ChangedT], OutT],
    prefixes: Callable[[ChangedT], Iterable[str]],
) -> OutT:
    """:func:`~gateway.app.admin.helpers.change_and_invalidate` in the thread pool: a one-click
    change (suspend, revoke) whose refusal is an error page, not a form."""
    return await run_in_threadpool(
        change_and_invalidate, change.state, change.session, write, present, prefixes
    )


def _no_choices(session: Session) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, kw_only=True)
class Resource(Generic[RowT]):
    """One table's dashboard pages: what differs between tiers, tenants and backends is the
    declaration, the flow is the methods (routes stay in the page module, visible)."""

    entity: str
    """``"tier"``: the row in its form's template ``tier_form.html``, the ``param`` of the
    API's 404 for it, the audit log's entity type; ``"Tier"`` in titles and flashes, and
    ``/ui/tiers`` the list (and navigation key) a change returns to."""
    fields: Mapping[str, Kind]
    required: tuple[str, ...]
    get: Callable[[Session, int | str], RowT]
    create: Callable[..., RowT]
    delete: Callable[..., None]
    update: Callable[..., RowT] | None = None
    """crud's update, for :meth:`patch` (absent where the page writes edits itself)."""
    edit_fields: Mapping[str, Kind] | None = None
    """The edit form's fields, where they are not the create form's."""
    choices: Callable[[Session], Mapping[str, Any]] = _no_choices
    """The form's other context (a select's options)."""
    shown: Callable[[RowT], dict[str, Any]] | None = None
    """A stored row as its edit form shows it, where that is not each field's column."""
    stale_keys: Callable[[RowT], Iterable[str]] | None = None
    """The key prefixes whose cached identities a deletion makes stale (read before it)."""

    @property
    def label(self) -> str:
        return self.entity.capitalize()

    @property
    def page(self) -> str:
        return f"{self.entity}s"

    @property
    def home(self) -> str:
        return f"/ui/{self.page}"

    def values_of(self, row: RowT) -> dict[str, Any]:
        """``row`` as its edit form shows it."""
        if self.shown is not None:
            return self.shown(row)
        return {name: input_text(getattr(row, name)) for name in self.edit_fields or self.fields}

    # ---- pages ----------------------------------------------------------------------------

    def form(
        self,
        request: Request,
        session: Session,
        row: RowT | None,
        values: Mapping[str, Any],
        *,
        errors: Mapping[str, str] | None = None,
        status_code: int = 200,
        **extra: Any,
    ) -> Response:
        """The create form (``row`` None) or the edit form, ``values`` typed in."""
        title = f"{self.label} {row.name}" if row is not None else f"New {self.label.lower()}"
        context = {**self.choices(session), **extra, self.entity: row}
        return render(
            request,
            f"{self.entity}_form.html",
            status_code=status_code,
            active=self.page,
            title=title,
            values=values,
            errors=errors or {},
            **context,
        )

    def edit_form(self, request: Request, session: Session, name: str) -> Response:
        row = resolve(self.get, session, name)
        return self.form(request, session, row, self.values_of(row))

    async def _again(
        self, change: Change, name: str | None, error: ApiError, values: Mapping[str, Any] | None
    ) -> Response:
        """The form once more after a refusal, the row re-read (a 404 if it is gone now): with
        what was typed and the message beside its field, or (``values`` None: a refused
        deletion) with the row as stored and the message above the form."""

        def page() -> Response:
            session = change.session
            row = resolve(self.get, session, name) if name is not None else None
            if values is None and row is not None:
                shown, errors = self.values_of(row), {FORM_ERROR: error.message}
            else:
                fields = self.fields if row is None else self.edit_fields or self.fields
                shown, errors = dict(values or {}), field_errors(error, fields)
            return self.form(
                change.request, session, row, shown, errors=errors, status_code=error.status
            )

        return await run_in_threadpool(page)

    # ---- transactions (blocking: run in the thread pool) -----------------------------------

    def insert(self, change: Change, body: BaseModel) -> str:
        """A new row from the API's create body, audited; its name."""
        with change.session.begin():
            row = self.create(change.session, actor=change.operator.actor, **body.model_dump())
            return row.name

    def patch(self, change: Change, name: str, body: BaseModel) -> Saved:
        """The API's PATCH body applied to the row ``name`` names, audited."""
        if self.update is None:
            raise TypeError(f"{self.label}: no crud update declared")
        with change.session.begin():
            row, changed = patch_row(
                change.session, change.operator.actor, name, self.get, self.update, body
            )
            return Saved(row.name, changed)

    def remove(self, change: Change, name: str) -> str:
        """Delete the row ``name`` names, audited; its name. Cached identities it made stale
        are dropped only once the deletion is committed."""
        with change.session.begin():
            row = resolve(self.get, change.session, name)
            stale = list(self.stale_keys(row)) if self.stale_keys is not None else None
            out = delete_row(
                change.session, change.operator.actor, self.delete, self.entity, row.id, row.name
            )
        if stale is not None:
            invalidate(change.state, stale)
        return out.name

    # ---- the POSTs ---------------------------------------------------------------------------

    async def post_new(
        self,
        change: Change,
        model: type[BaseModel],
        *,
        verb: str = "created",
        after: After | None = None,
    ) -> Response:
        """Create from the form; back to the list, or the form again with the refusal."""
        values, result = await submit(
            change,
            self.fields,
            model,
            lambda body: self.insert(change, body),
            blank_is_null=False,
            required=self.required,
        )
        if isinstance(result, ApiError):
            return await self._again(change, None, result, values)
        if after is not None:
            await after()
        return redirect(change.request, self.home, flash=f"{self.label} {result} {verb}.")

    async def post_edit(
        self,
        change: Change,
        name: str,
        model: type[ModelT],
        save: Callable[[ModelT], Saved] | None = None,
        *,
        after: After | None = None,
    ) -> Response:
        """Save the edit form (``save``, else :meth:`patch`); ``after`` runs only when
        something was written. A row gone meanwhile is the API's 404 page."""

        def write(body: ModelT) -> Saved:
            return save(body) if save is not None else self.patch(change, name, body)

        values, result = await submit(
            change,
            self.edit_fields or self.fields,
            model,
            write,
            blank_is_null=True,
            required=self.required,
        )
        if isinstance(result, ApiError):
            if result.status == 404 and result.param == self.entity:
                raise result
            return await self._again(change, name, result, values)
        if result.changed and after is not None:
            await after()
        outcome = " saved." if result.changed else ": nothing changed."
        return redirect(change.request, self.home, flash=f"{self.label} {result.name}{outcome}")

    async def post_delete(
        self,
        change: Change,
        name: str,
        *,
        verb: str = "deleted",
        after: After | None = None,
        refusal_on_form: bool = False,
    ) -> Response:
        """Delete; a refusal is the API's error page, or (``refusal_on_form``: a tier still in
        use) the edit form with the reason above it."""
        result = await run_in_threadpool(attempt, lambda: self.remove(change, name))
        if isinstance(result, ApiError):
            if result.status == 404 or not refusal_on_form:
                raise result
            return await self._again(change, name, result, None)
        if after is not None:
            await after()
        return redirect(change.request, self.home, flash=f"{self.label} {result} {verb}.")
