"""Domain errors of the data layer.

The admin API answers them in the gateway's one error dialect (:func:`gateway.errors.domain_error`:
``NotFound`` 404 ``not_found``, ``Conflict`` 409 ``already_exists`` / ``in_use`` / ``conflict``,
``InvalidInput`` 400 ``invalid_value``, the status and code a schema's refusal of the same value
gets) and the CLI exits with code 2, so the messages are written for the person who sent the
input: they name the entity, the field and the offending value.

Errors the database itself raises (SQLAlchemy's) are sorted by :func:`classify` into what they
mean for the caller — a concurrent change won, the database is busy or unreachable, its schema
is behind — and summarised by :func:`describe` for logs and messages without their text, which
names the statement and, on PostgreSQL, the offending values (an API key's hash included).
"""

from __future__ import annotations

import enum

from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm.exc import ObjectDeletedError, StaleDataError


class DomainError(Exception):
    """Base of every error the CRUD layer raises on purpose."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the input field at fault, when there is one (OpenAI's ``param``)


class NotFound(DomainError):
    """The referenced tier, tenant, key or backend does not exist."""


class Conflict(DomainError):
    """The change conflicts with the current state of the database."""


class AlreadyExists(Conflict):
    """A unique name (or key prefix) is already taken."""


class InUse(Conflict):
    """The entity is still referenced (e.g. a tier that tenants are on) and cannot go."""


class InvalidInput(DomainError):
    """A value is out of range, of the wrong type or inconsistent with another one."""


# -- errors of the database itself ------------------------------------------------------------


class DatabaseFailure(enum.Enum):
    """What a database error means for the caller; :func:`classify` decides."""

    CONFLICT = "conflict"
    """A concurrent change won (a unique or foreign key, a deadlock, a serialization failure, a
    row gone meanwhile); the transaction was rolled back, so re-reading and retrying is safe."""
    INVALID = "invalid"
    """A value the database's own constraints refuse (CHECK, NOT NULL) that no validation
    caught first, or one its types cannot hold (text with a NUL character or not in the
    database's encoding, a string longer than its column)."""
    BUSY = "busy"
    """A lock or the connection pool stayed taken past its timeout; retry shortly."""
    UNAVAILABLE = "unavailable"
    """The database cannot be reached or opened, or cannot work (its disk full, out of memory,
    an I/O error): a state that passes, not the caller's doing."""
    SCHEMA = "schema"
    """A table or column is missing: the schema is not the one this code expects."""
    INTERNAL = "internal"
    """Anything else."""


_SQLITE_BUSY = frozenset({5, 6})  # SQLITE_BUSY ("database is locked"), SQLITE_LOCKED
_SQLITE_CANTOPEN = 14
_SQLITE_UNAVAILABLE = frozenset(  # NOMEM, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL
    {7, 8, 10, 13, _SQLITE_CANTOPEN, 15}
)
_SQLITE_SCHEMA_TEXT = ("no such table", "no such column")
_UNIQUE = frozenset({"23505", "SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY"})
_INVALID = frozenset(  # NOT NULL and CHECK violations: PostgreSQL's SQLSTATE, SQLite's names
    {"23502", "23514", "SQLITE_CONSTRAINT_NOTNULL", "SQLITE_CONSTRAINT_CHECK"}
)
_PG_INVALID_DATA = frozenset(  # string too long, character not in repertoire, untranslatable
    {"22001", "22021", "22P05"}
)
_PSYCOPG_NUL = "cannot contain NUL"
"""psycopg's own DataError (raised before the server sees the value, so without a SQLSTATE):
'PostgreSQL text fields cannot contain NUL (0x00) bytes'."""
_PG_CONFLICT = frozenset({"40001", "40P01"})  # serialization failure, deadlock detected
_PG_BUSY = frozenset({"55P03", "57014", "53300"})  # lock not available, timeout, no connections
_PG_UNAVAILABLE = frozenset({"57P01", "57P02", "57P03"})  # shutting down, cannot connect now
_PG_UNAVAILABLE_CLASSES = ("08", "53", "58")
"""Connection exceptions; insufficient resources (a full disk, out of memory; too many
connections is ``busy``); system errors (I/O)."""
_PG_SCHEMA = frozenset({"42P01", "42703"})  # undefined table, undefined column


def _driver_error(exc: SQLAlchemyError) -> BaseException | None:
    return exc.orig if isinstance(exc, DBAPIError) else None


def _sqlstate(orig: BaseException | None) -> str | None:
    """PostgreSQL's SQLSTATE (psycopg 3 ``sqlstate``, psycopg2 ``pgcode``); None elsewhere."""
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(code) if code else None


def _sqlite_code(orig: BaseException | None) -> int | None:
    """SQLite's primary result code (the extended code's low byte); None elsewhere."""
    code = getattr(orig, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _code(orig: BaseException | None) -> str | None:
    """The driver's error code: PostgreSQL's SQLSTATE, SQLite's extended result code name."""
    return _sqlstate(orig) or getattr(orig, "sqlite_errorname", None)


def is_unique_violation(exc: IntegrityError) -> bool:
    """Whether ``exc`` is a taken unique value (not a foreign key, CHECK or NOT NULL)."""
    return _code(exc.orig) in _UNIQUE


def classify(exc: SQLAlchemyError) -> DatabaseFailure:
    """What ``exc`` means for the caller, from its class and the driver's error code."""
    if isinstance(exc, IntegrityError):
        invalid = _code(exc.orig) in _INVALID
        return DatabaseFailure.INVALID if invalid else DatabaseFailure.CONFLICT
    if isinstance(exc, StaleDataError | ObjectDeletedError):
        return DatabaseFailure.CONFLICT
    if isinstance(exc, PoolTimeout):
        return DatabaseFailure.BUSY
    orig = _driver_error(exc)
    state, sqlite_code = _sqlstate(orig), _sqlite_code(orig)
    if _unstorable_text(exc, state):
        return DatabaseFailure.INVALID
    if state in _PG_CONFLICT:
        return DatabaseFailure.CONFLICT
    if state in _PG_BUSY or sqlite_code in _SQLITE_BUSY:
        return DatabaseFailure.BUSY
    if state in _PG_SCHEMA or (sqlite_code == 1 and str(orig).startswith(_SQLITE_SCHEMA_TEXT)):
        return DatabaseFailure.SCHEMA
    if _unreachable(exc, state, sqlite_code):
        return DatabaseFailure.UNAVAILABLE
    return DatabaseFailure.INTERNAL


def _unstorable_text(exc: SQLAlchemyError, state: str | None) -> bool:
    """Whether ``exc`` refuses a value PostgreSQL's text cannot hold: a NUL character (refused
    by psycopg before sending), a character outside the database's encoding, or a string longer
    than its column. Read from the driver's message only for psycopg's NUL (it has no SQLSTATE);
    the message never leaves this function."""
    if not isinstance(exc, DataError):
        return False
    if state is not None:
        return state in _PG_INVALID_DATA
    return _PSYCOPG_NUL in str(exc.orig)


def _unreachable(exc: SQLAlchemyError, state: str | None, sqlite_code: int | None) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if sqlite_code in _SQLITE_UNAVAILABLE:
        return True
    if state is not None:
        return state.startswith(_PG_UNAVAILABLE_CLASSES) or state in _PG_UNAVAILABLE
    # a server driver's OperationalError with no SQLSTATE failed before the server answered;
    # an InterfaceError is the driver's connection object failing (e.g. already closed)
    return isinstance(exc, OperationalError | InterfaceError) and sqlite_code is None


def describe(exc: SQLAlchemyError) -> str:
    """``exc`` in words safe for any log or terminal: class names and error codes only.

    Never the driver's message or the statement: both can carry values (PostgreSQL's
    ``DETAIL: Key (key_hash)=(...) already exists``).
    """
    orig = _driver_error(exc)
    if orig is None:
        return type(exc).__name__
    code = _code(orig)
    return f"{type(exc).__name__} ({type(orig).__name__}{f' {code}' if code else ''})"
