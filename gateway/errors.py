"""The gateway's one error dialect, OpenAI's: ``{"error": {"message", "type", "param", "code"}}``.

The data plane (``/v1``), the admin API (``/admin/v1``) and the app itself (413, unknown routes)
answer every error as an :class:`ApiError`, which the ``openai`` client parses into its typed
exceptions (``BadRequestError``, ``AuthenticationError``, ``RateLimitError``, ...). The same
mistake gets the same status and ``code`` on both planes:

* body not JSON, empty, nested deeper than ``MAX_JSON_DEPTH`` (128), or with a string UTF-8
  cannot encode (a lone surrogate, ``"\\ud800"``): 400 ``invalid_json`` (:func:`parse_json_body`;
  the admin API runs :func:`check_json_depth` and :func:`check_json_text` before FastAPI parses);
* a value of the wrong type (and a body that is not an object): 400 ``invalid_type``;
* a required field missing: 400 ``missing_required_parameter``;
* a field the endpoint refuses: 400 ``unknown_parameter`` (admin bodies; ``/v1`` passes unknown
  fields on to the engine);
* a value out of range or not allowed, by the schema or by the data layer's rules: 400
  ``invalid_value`` (also a NUL character in any admin path, query or body string:
  :func:`nul_character`);
* no such tier, tenant, key, backend or profile: 404 ``not_found`` (``/v1``: ``model_not_found``);
* the workflow headers of ``/v1`` (:mod:`gateway.app.kinds`; ``param`` is the header):
  a malformed ``x-tiergate-workflow-id`` or ``x-tiergate-workflow-deadline-ms``, or a workflow
  deadline without an id to name, 400 ``invalid_value``; a workflow deadline tighter than the
  tier allows, 400 ``invalid_request`` (as for the SLO headers); an id the gateway does not know
  (never created, or forgotten after its TTL) without a deadline to start it, 400
  ``unknown_workflow``; a call after its workflow's deadline, 409 ``workflow_expired`` — neither
  creates a workflow;
* a name taken, an entity still in use, a concurrent change: 409 ``already_exists``, ``in_use``,
  ``conflict``;
* the database busy (a lock held past its timeout) or unreachable: 503 ``database_busy`` /
  ``database_unavailable`` with ``Retry-After`` (:func:`database_error`: never a bare 500).

400 and not 422 because OpenAI and vLLM answer 400, so a client sees the gateway fail like the
API it stands in for. ``param`` names the offending field: a dotted path for nested ones
(``messages.0.role``), ``None`` for the body as a whole.

The module imports nothing of the web app (:mod:`gateway.app`) or the emulated engine, so the
engine and the CLI can word their errors with it too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from gateway.db.errors import (
    AlreadyExists,
    Conflict,
    DatabaseFailure,
    DomainError,
    InUse,
    InvalidInput,
    NotFound,
    classify,
    describe,
)
from gateway.jsonbody import (
    MAX_JSON_DEPTH,
    UNPARSED,
    Location,
    json_depth_exceeds,
    lone_surrogate_at,
    too_deep_message,
)

if TYPE_CHECKING:
    from fastapi.exceptions import RequestValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from gateway.limits import AdmissionRejected

log = logging.getLogger(__name__)

INVALID_JSON = "invalid_json"
INVALID_TYPE = "invalid_type"
MISSING_PARAMETER = "missing_required_parameter"
UNKNOWN_PARAMETER = "unknown_parameter"
INVALID_VALUE = "invalid_value"
INVALID_REQUEST = "invalid_request"  # a request wrong as a whole (e.g. an SLO header), no field
NOT_FOUND = "not_found"
CONFLICT = "conflict"


# -- the envelope -----------------------------------------------------------------------------


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"  # OpenAI's class of error; ``code`` tells them apart
    param: str | None = None
    code: str | None = None


class ErrorOut(BaseModel):
    """OpenAI's error envelope: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorBody


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status: every 4xx is the client's, 429 rate limits."""
    if status == 429:
        return "rate_limit_exceeded"
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


class ApiError(Exception):
    """An error answered to the client as OpenAI does."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    @classmethod
    def from_rejection(cls, exc: AdmissionRejected) -> ApiError:
        return cls(exc.status_code, exc.message, code=exc.reason.value, headers=exc.headers())

    def body(self) -> dict[str, Any]:
        """The envelope as :class:`ErrorOut` documents it (a plain dict: 429s can be many)."""
        return {
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def sse_event(self) -> bytes:
        """The error as a final SSE event (a stream that already sent its 200 header)."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


def error_responses(descriptions: Mapping[int | str, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries: each status answers an :class:`ErrorOut`."""
    return {
        status: {"model": ErrorOut, "description": text} for status, text in descriptions.items()
    }


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key")


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code=INVALID_REQUEST, param=param)


# -- bodies that are not JSON -----------------------------------------------------------------


def invalid_json(detail: str, position: int | None = None) -> ApiError:
    at = f" (at character {position})" if position is not None else ""
    return ApiError(400, f"the request body is not valid JSON: {detail}{at}", code=INVALID_JSON)


def empty_body() -> ApiError:
    return ApiError(400, "the request body is empty: send a JSON object", code=INVALID_JSON)


def too_deeply_nested(limit: int = MAX_JSON_DEPTH) -> ApiError:
    """400 ``invalid_json`` for a body whose arrays and objects nest deeper than ``limit``
    (measured before parsing, :mod:`gateway.jsonbody`: a parser recurses once per level)."""
    return ApiError(400, too_deep_message(limit), code=INVALID_JSON)


def check_json_depth(raw: bytes) -> None:
    """Raise :func:`too_deeply_nested` for a body nested deeper than ``MAX_JSON_DEPTH``."""
    if json_depth_exceeds(raw):
        raise too_deeply_nested()


def unencodable_string(param: str | None) -> ApiError:
    """400 ``invalid_json`` for a string with a lone surrogate: JSON's grammar allows the escape,
    but the text is not Unicode (RFC 7493 forbids it), so no UTF-8 encoder downstream (the
    database driver, the engine's request, this answer) can take it. ``param``: the string's
    field, None for the body itself."""
    where = f"{param}: " if param is not None else ""
    message = (
        f"{where}the string holds a lone UTF-16 surrogate (e.g. \\ud800 without its pair), "
        "which is not Unicode text: send valid UTF-8"
    )
    return ApiError(400, message, code=INVALID_JSON, param=param)


def check_json_text(raw: bytes, value: Any = UNPARSED) -> None:
    """Raise :func:`unencodable_string` for a body (parsed: ``value``) with a lone surrogate
    (:func:`gateway.jsonbody.lone_surrogate_at`: cheap unless the body has a surrogate escape)."""
    where = lone_surrogate_at(raw, value)
    if where is not None:
        raise unencodable_string(dotted(where))


def nul_character(param: str | None) -> ApiError:
    """400 ``invalid_value`` for a NUL character in a string: PostgreSQL's text refuses it (and
    SQLite would store a name no one can type), so the admin API refuses it on both alike."""
    where = f"{param}: " if param is not None else ""
    message = f"{where}must not contain a NUL character (\\u0000, %00)"
    return ApiError(400, message, code=INVALID_VALUE, param=param)


def dotted(where: Location) -> str | None:
    """A :data:`~gateway.jsonbody.Location` as OpenAI's ``param`` (``messages.0.content``);
    None for the body itself."""
    return ".".join(str(part) for part in where) or None


def parse_json_body(raw: bytes) -> Any:
    """The body's JSON value; 400 ``invalid_json`` for an empty body, one nested too deeply
    (checked before parsing), one that is not JSON (malformed, not UTF-8, an integer of more
    digits than the interpreter converts), or one with a string UTF-8 cannot encode."""
    if not raw:
        raise empty_body()
    check_json_depth(raw)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise invalid_json(exc.msg, exc.pos) from None
    except UnicodeDecodeError as exc:
        raise invalid_json(str(exc)) from None
    except ValueError:  # int() refuses more than 4300 digits (sys.get_int_max_str_digits)
        raise invalid_json("a number has too many digits") from None
    check_json_text(raw, value)
    return value


# -- validation errors ------------------------------------------------------------------------

# pydantic names a union's members in ``loc`` ("str", "constrained-int", "list[str]", a model's
# class name): they say which alternative failed, not where the client went wrong.
_MEMBER_TAGS = frozenset(
    {"str", "int", "float", "bool", "bytes", "none", "list", "dict", "tuple", "set", "frozenset"}
)
# pydantic error types outside the ``*_type`` / ``*_parsing`` families that mean "wrong type"
_TYPE_ERRORS = frozenset({"int_from_float", "model_attributes_type", "model_type"})
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})  # FastAPI's loc[0]
_UNREADABLE_BODY = "There was an error parsing the body"  # FastAPI's 400 for a non-UTF-8 body


def _is_member_tag(part: object) -> bool:
    if not isinstance(part, str) or not part:
        return False
    return part in _MEMBER_TAGS or part[0].isupper() or any(c in part for c in "[-(")


def _param(loc: Sequence[Any]) -> str | None:
    """The dotted path to the offending field, up to the first union-member tag."""
    parts: list[str] = []
    for part in loc:
        if _is_member_tag(part):
            break
        parts.append(str(part))
    return ".".join(parts) or None


def _code(kind: str) -> str:
    if kind == "missing":
        return MISSING_PARAMETER
    if kind == "extra_forbidden":
        return UNKNOWN_PARAMETER
    if kind.endswith(("_type", "_parsing")) or kind in _TYPE_ERRORS:
        return INVALID_TYPE
    return INVALID_VALUE


def _first_problem(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, str]:
    """``(message, param, code)`` for the first field at fault, counting the others.

    When a union's members all fail, the one whose type matched says what is wrong with the
    value ("must be >= 1" beats "must be a string" for a 0).
    """
    located = [(_param(error.get("loc", ())), error) for error in errors]
    param, error = located[0]
    same_field = [e for p, e in located if p == param]
    error = next((e for e in same_field if _code(e.get("type", "")) != INVALID_TYPE), error)
    code = _code(str(error.get("type", "")))
    if param is None and code == INVALID_TYPE:
        message = "the request body must be a JSON object"
    else:
        text = str(error.get("msg", "invalid value"))
        message = f"{param}: {text}" if param is not None else text
    others = len({p for p, _ in located} - {param})
    if others:
        message += f" (and {others} more error{'s' if others > 1 else ''})"
    return message, param, code


def describe_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """A one-line message naming the first offending field, and that field (OpenAI's
    ``param``): for a caller with its own error envelope (the emulated engine's vLLM one)."""
    message, param, _ = _first_problem(exc.errors())
    return message, param


def invalid_body(exc: ValidationError) -> ApiError:
    """400 naming the first field a body's ``model_validate`` refused."""
    message, param, code = _first_problem(exc.errors())
    return ApiError(400, message, code=code, param=param)


def invalid_request(exc: RequestValidationError) -> ApiError:
    """FastAPI's validation errors (body, query, path) in the same words as :func:`invalid_body`."""
    errors = list(exc.errors())
    if not errors:  # pragma: no cover - FastAPI never raises an empty one
        return bad_request("invalid request")
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "malformed JSON")
        return invalid_json(str(detail), loc[1] if len(loc) > 1 else None)
    if first.get("type") == "missing" and loc == ("body",):
        return empty_body()
    relative = [{**e, "loc": _without_source(e.get("loc", ()))} for e in errors]
    message, param, code = _first_problem(relative)
    return ApiError(400, message, code=code, param=param)


def _without_source(loc: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(loc[1:]) if loc and loc[0] in _SOURCES else tuple(loc)


def http_error(exc: HTTPException) -> ApiError:
    """Starlette's and FastAPI's own errors: an unknown route, a wrong method, an unreadable
    body (which is invalid JSON: JSON is UTF-8)."""
    detail = str(exc.detail)
    code = INVALID_JSON if exc.status_code == 400 and detail == _UNREADABLE_BODY else None
    return ApiError(exc.status_code, detail, code=code, headers=dict(exc.headers or {}))


# -- the data layer's errors ------------------------------------------------------------------

_CONFLICT_CODES: tuple[tuple[type[Conflict], str], ...] = (
    (AlreadyExists, "already_exists"),
    (InUse, "in_use"),
)


def domain_error(exc: DomainError) -> ApiError:
    """404 / 409 / 400 for the data layer's errors; the message is written for the caller.

    A value the data layer refuses is the same mistake as one the schema refuses: 400
    ``invalid_value``.
    """
    if isinstance(exc, NotFound):
        return ApiError(404, exc.message, code=NOT_FOUND, param=exc.param)
    if isinstance(exc, Conflict):
        code = next((c for t, c in _CONFLICT_CODES if isinstance(exc, t)), CONFLICT)
        return ApiError(409, exc.message, code=code, param=exc.param)
    code = INVALID_VALUE if isinstance(exc, InvalidInput) else INVALID_REQUEST
    return ApiError(400, exc.message, code=code, param=exc.param)


def concurrent_change() -> ApiError:
    """409 for a change a concurrent one beat (a unique or foreign key the pre-checks missed)."""
    message = "the change conflicts with a concurrent one; re-read and retry"
    return ApiError(409, message, code=CONFLICT)


DATABASE_BUSY = "database_busy"
DATABASE_UNAVAILABLE = "database_unavailable"
DATABASE_ERROR = "database_error"
BUSY_RETRY_AFTER_S = 1
UNAVAILABLE_RETRY_AFTER_S = 5


def database_error(exc: SQLAlchemyError) -> ApiError:
    """The answer to a database error no caller handled, by what it means (:func:`classify`).

    A lost race is the client's 409, a value only the database's constraints refused its 400;
    a busy or unreachable database a 503 with ``Retry-After``
    (the transaction was rolled back: retrying is safe); anything else a 500. The error's own
    text never reaches the answer or the log: it names the statement and, on PostgreSQL, the
    offending values. The log line says what kind of failure it was and its codes.
    """
    failure = classify(exc)
    if failure is DatabaseFailure.CONFLICT:
        return concurrent_change()
    if failure is DatabaseFailure.INVALID:
        return ApiError(400, "a value is outside what the database allows", code=INVALID_VALUE)
    if failure is DatabaseFailure.BUSY:
        log.warning("database busy: %s", describe(exc))
        return ApiError(
            503,
            "the database is busy with other changes; retry shortly",
            code=DATABASE_BUSY,
            headers={"retry-after": str(BUSY_RETRY_AFTER_S)},
        )
    if failure is DatabaseFailure.UNAVAILABLE:
        log.error("database unavailable: %s", describe(exc))
        return ApiError(
            503,
            "the database is unavailable; retry later",
            code=DATABASE_UNAVAILABLE,
            headers={"retry-after": str(UNAVAILABLE_RETRY_AFTER_S)},
        )
    log.error("database error (%s): %s", failure.value, describe(exc))
    message = (
        "the database lacks a table or column this gateway needs: is it migrated "
        "(`tiergate db upgrade`)?"
        if failure is DatabaseFailure.SCHEMA
        else "internal database error"
    )
    return ApiError(500, message, code=DATABASE_ERROR)
