"""HTML forms in, the admin API's request models out, its errors back beside the field.

A form sends text; the admin API takes JSON. :func:`convert` turns each field into the JSON
value a person meant (``"3"`` → 3, ``""`` → absent or null, a checkbox → a boolean) and leaves
what is not a number as text, so the API's own model refuses it in the API's own words
(:func:`validate` → :func:`gateway.errors.invalid_body`). The data layer's refusals come back
as :class:`~gateway.db.errors.DomainError` and are worded by
:func:`gateway.errors.domain_error`. Either way the form is shown again with what was typed
and the message beside the field it names (``id="error-<field>"``), status 400 (409 for a
taken name, 404 for a reference to nothing, as the API answers).
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import SQLAlchemyError

from gateway.db.errors import DomainError
from gateway.errors import ApiError, database_error, domain_error, invalid_body, nul_character

Kind = Literal["text", "number", "bool", "datetime", "ref"]
ModelT = TypeVar("ModelT", bound=BaseModel)
ResultT = TypeVar("ResultT")

FORM_ERROR = "__form__"
"""The key of an error that names no field of the form (shown above it)."""

POLICY_FIELDS: dict[str, Kind] = dict.fromkeys(
    ("ttft_ms", "tpot_ms", "deadline_ms", "rpm_limit", "tpm_limit", "max_concurrency"), "number"
)
"""The SLOs and limits a tier sets and a tenant may override: one list, so the two forms agree."""

_INTEGER = re.compile(r"[+-]?\d{1,30}")

FORM_TOKEN = "form_token"
"""The hidden field of a form that must act once (issuing a key): a random token made when the
form is rendered. A browser that sends the form again (a reload of its answer) sends the same
token, and the change it already made is found instead of made twice."""


def new_form_token() -> str:
    """A fresh one-time form token (192 random bits), for a form about to be rendered."""
    return secrets.token_urlsafe(24)


async def form_token(request: Request) -> str | None:
    """The submitted form's one-time token, or None (a form rendered before tokens existed, or
    a scripted post: it acts without the once-only guard, as the admin API does)."""
    value = (await request.form()).get(FORM_TOKEN)
    if not isinstance(value, str):
        return None
    if "\x00" in value:
        raise nul_character(FORM_TOKEN)
    return value.strip() or None


async def read_form(request: Request) -> dict[str, str]:
    """The submitted fields as text (the CSRF and form tokens left out; for a repeated name,
    e.g. a checkbox after its hidden "false", the last). A NUL character is refused as the API
    refuses it."""
    form = await request.form()
    values: dict[str, str] = {}
    for name, value in form.multi_items():
        if name in ("csrf_token", FORM_TOKEN) or not isinstance(value, str):
            continue
        if "\x00" in value or "\x00" in name:
            raise nul_character(name.replace("\x00", "\\u0000"))
        values[name] = value
    return values


def _number(text: str) -> Any:
    if _INTEGER.fullmatch(text):
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return text  # the model says "should be a valid number"
    return value if math.isfinite(value) else text


def _datetime(text: str) -> str:
    """A ``datetime-local`` value is the operator's wall clock without an offset; the form says
    it is UTC, so it is read as UTC. A value with an offset is kept."""
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?", text):
        return f"{text if len(text) > 16 else text + ':00'}+00:00"
    return text


def convert(
    values: Mapping[str, str],
    fields: Mapping[str, Kind],
    *,
    blank_is_null: bool,
    required: Iterable[str] = (),
) -> dict[str, Any]:
    """The JSON body the admin API would get for this form.

    A blank field is absent (creating: the API's default applies) or, with ``blank_is_null``,
    null (editing: clears an optional value). A blank ``required`` field stays "", so the
    API's model names it. Fields the form does not declare are ignored.
    """
    must = set(required)
    body: dict[str, Any] = {}
    for name, kind in fields.items():
        if kind == "bool":
            body[name] = values.get(name, "false").strip().lower() in ("true", "on", "1", "yes")
            continue
        if name not in values:
            continue
        text = values[name].strip()
        if not text:
            if name in must:
                body[name] = ""
            elif blank_is_null:
                body[name] = None
            continue
        if kind == "number":
            body[name] = _number(text)
        elif kind == "datetime":
            body[name] = _datetime(text)
        elif kind == "ref":
            body[name] = text
        else:
            body[name] = values[name] if name == "description" else text
    return body


def input_text(value: Any) -> Any:
    """A stored value as a form shows it: exact numbers without a trailing ``.0``."""
    if value is None:
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def validate(model: type[ModelT], body: Mapping[str, Any]) -> ModelT:
    """``body`` as the admin API's request ``model``, or the API's 400 for it."""
    try:
        return model.model_validate(dict(body))
    except ValidationError as exc:
        raise invalid_body(exc) from None


def field_errors(error: ApiError, fields: Iterable[str]) -> dict[str, str]:
    """``{field: message}`` for the form: beside the field the error names, else above it."""
    names = set(fields)
    key = error.param if error.param in names else FORM_ERROR
    return {str(key): error.message}


def attempt(change: Callable[[], ResultT]) -> ResultT | ApiError:
    """Run a change; a refusal comes back as the API's error instead of being raised."""
    try:
        return change()
    except ApiError as exc:
        return exc
    except DomainError as exc:
        return domain_error(exc)
    except SQLAlchemyError as exc:
        return database_error(exc)
