"""Backends: the engines the gateway routes to, each tied to a latency profile by name.

The profile is a shipped one (:func:`priority.profiles.available_profiles`) or one stored with
:func:`gateway.db.crud.profiles.import_profile`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from gateway.db.crud._common import (
    add_named,
    check_bool,
    check_choice,
    check_fields,
    check_name,
    delete_audited,
    find_named,
    get_named,
    lock,
    update_named,
)
from gateway.db.crud.pages import count_rows, page
from gateway.db.crud.profiles import is_known_profile, stored_profile_names
from gateway.db.errors import InvalidInput
from gateway.db.models import BACKEND_KINDS, Backend
from priority.profiles import available_profiles

ENTITY = "backend"
UPDATABLE = ("name", "base_url", "model", "profile", "kind", "enabled")


def check_url(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 512:
        raise InvalidInput(f"base_url must be an http(s) URL, got {value!r}", param="base_url")
    try:
        parts = urlsplit(value)
        host, _ = parts.hostname, parts.port  # both parse lazily and raise on a bad host/port
    except ValueError as exc:  # an unbalanced "[", a port out of range
        raise InvalidInput(
            f"base_url is not a valid URL ({exc}): {value!r}", param="base_url"
        ) from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidInput(
            f"base_url must be an http(s) URL with a host, got {value!r}", param="base_url"
        )
    return value.rstrip("/")


def check_profile(session: Session, value: Any) -> str:
    """A shipped profile's name or a stored (imported) one's."""
    if isinstance(value, str) and is_known_profile(session, value):
        return value
    known = sorted({*available_profiles(), *stored_profile_names(session)})
    raise InvalidInput(
        f"unknown profile {value!r}; known profiles: {', '.join(known)}", param="profile"
    )


def check_model(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise InvalidInput(f"model must be a non-empty name, got {value!r}", param="model")
    return value


def validate_backend(session: Session, state: Mapping[str, Any]) -> dict[str, Any]:
    """Check a backend's complete state (the profile against the database's stored ones)."""
    return {
        "name": check_name(state.get("name"), ENTITY),
        "base_url": check_url(state.get("base_url")),
        "model": check_model(state.get("model")),
        "profile": check_profile(session, state.get("profile")),
        "kind": check_choice(state.get("kind", "vllm"), "kind", BACKEND_KINDS),
        "enabled": check_bool(state.get("enabled", True), "enabled"),
    }


def get_backend(session: Session, ref: int | str) -> Backend:
    """A backend by id (int) or name (str)."""
    return get_named(session, Backend, ref, ENTITY)


def find_backend(session: Session, name: str) -> Backend | None:
    return find_named(session, Backend, name)


def _backend_query(enabled: bool | None, model: str | None) -> Select[Any]:
    query = select(Backend)
    if enabled is not None:
        query = query.where(Backend.enabled.is_(enabled))
    if model is not None:
        query = query.where(Backend.model == model)
    return query


def list_backends(
    session: Session,
    *,
    enabled: bool | None = None,
    model: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[Backend]:
    """Backends by name (unique: stable pages)."""
    query = _backend_query(enabled, model).order_by(Backend.name)
    return list(session.scalars(page(query, limit, offset)))


def count_backends(
    session: Session, *, enabled: bool | None = None, model: str | None = None
) -> int:
    """How many backends :func:`list_backends` lists with the same filters."""
    return count_rows(session, _backend_query(enabled, model))


def create_backend(
    session: Session,
    *,
    actor: str,
    name: str,
    base_url: str,
    model: str,
    profile: str,
    kind: str = "vllm",
    enabled: bool = True,
) -> Backend:
    values = validate_backend(
        session,
        {
            "name": name,
            "base_url": base_url,
            "model": model,
            "profile": profile,
            "kind": kind,
            "enabled": enabled,
        },
    )
    return add_named(session, Backend(**values), name, find_backend, actor=actor, entity=ENTITY)


def update_backend(
    session: Session,
    ref: int | str,
    changes: Mapping[str, Any],
    *,
    actor: str,
    action: str = "update",
) -> Backend:
    """Partial update; a no-op writes no audit row."""
    check_fields(changes, UPDATABLE, ENTITY)
    backend = lock(session, get_backend(session, ref), ENTITY)
    update_named(
        session,
        backend,
        changes,
        validate=partial(validate_backend, session),
        find=find_backend,
        actor=actor,
        action=action,
        entity=ENTITY,
    )
    return backend


def set_backend_enabled(session: Session, ref: int | str, enabled: bool, *, actor: str) -> Backend:
    action = "enable" if enabled else "disable"
    return update_backend(session, ref, {"enabled": enabled}, actor=actor, action=action)


def delete_backend(session: Session, ref: int | str, *, actor: str) -> None:
    backend = lock(session, get_backend(session, ref), ENTITY)
    delete_audited(session, backend, actor=actor, entity=ENTITY)
