"""Backends: the engines the gateway routes to, each tied to a shipped latency profile."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db.crud._common import (
    add_named,
    check_bool,
    check_choice,
    check_fields,
    check_name,
    delete_audited,
    update_named,
)
from gateway.db.errors import InvalidInput, NotFound
from gateway.db.models import BACKEND_KINDS, Backend
from priority.profiles import available_profiles

ENTITY = "backend"
UPDATABLE = ("name", "base_url", "model", "profile", "kind", "enabled")


def check_url(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 512:
        raise InvalidInput(f"base_url must be an http(s) URL, got {value!r}", param="base_url")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(
            f"base_url must be an http(s) URL with a host, got {value!r}", param="base_url"
        )
    return value.rstrip("/")


def check_profile(value: Any) -> str:
    known = available_profiles()
    if value not in known:
        raise InvalidInput(
            f"unknown profile {value!r}; known profiles: {', '.join(known)}", param="profile"
        )
    return str(value)


def check_model(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise InvalidInput(f"model must be a non-empty name, got {value!r}", param="model")
    return value


def validate_backend(state: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": check_name(state.get("name"), ENTITY),
        "base_url": check_url(state.get("base_url")),
        "model": check_model(state.get("model")),
        "profile": check_profile(state.get("profile")),
        "kind": check_choice(state.get("kind", "vllm"), "kind", BACKEND_KINDS),
        "enabled": check_bool(state.get("enabled", True), "enabled"),
    }


def get_backend(session: Session, ref: int | str) -> Backend:
    """A backend by id (int) or name (str)."""
    column = Backend.id if isinstance(ref, int) else Backend.name
    backend = session.scalar(select(Backend).where(column == ref))
    if backend is None:
        raise NotFound(f"backend {ref!r} does not exist", param="backend")
    return backend


def find_backend(session: Session, name: str) -> Backend | None:
    return session.scalar(select(Backend).where(Backend.name == name))


def list_backends(
    session: Session, *, enabled: bool | None = None, model: str | None = None
) -> list[Backend]:
    query = select(Backend).order_by(Backend.name)
    if enabled is not None:
        query = query.where(Backend.enabled.is_(enabled))
    if model is not None:
        query = query.where(Backend.model == model)
    return list(session.scalars(query))


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
        {
            "name": name,
            "base_url": base_url,
            "model": model,
            "profile": profile,
            "kind": kind,
            "enabled": enabled,
        }
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
    backend = get_backend(session, ref)
    update_named(
        session,
        backend,
        changes,
        validate=validate_backend,
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
    delete_audited(session, get_backend(session, ref), actor=actor, entity=ENTITY)
