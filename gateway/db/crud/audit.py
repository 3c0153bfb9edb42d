"""Reading the audit log (the CRUD modules write it)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from gateway.db.crud.pages import count_rows, page
from gateway.db.models import AuditLog


def _audit_query(
    entity_type: str | None,
    entity_id: object | None,
    actor: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Select[Any]:
    query = select(AuditLog)
    if entity_type is not None:
        query = query.where(AuditLog.entity_type == entity_type)
    if entity_id is not None:
        query = query.where(AuditLog.entity_id == str(entity_id))
    if actor is not None:
        query = query.where(AuditLog.actor == actor)
    if since is not None:
        query = query.where(AuditLog.at >= since)
    if until is not None:
        query = query.where(AuditLog.at < until)
    return query


def list_audit(
    session: Session,
    *,
    entity_type: str | None = None,
    entity_id: object | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[AuditLog]:
    """Audit rows in ``[since, until)``, newest first (id breaks ties: stable pages)."""
    query = _audit_query(entity_type, entity_id, actor, since, until).order_by(
        AuditLog.at.desc(), AuditLog.id.desc()
    )
    return list(session.scalars(page(query, limit, offset)))


def count_audit(
    session: Session,
    *,
    entity_type: str | None = None,
    entity_id: object | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> int:
    """How many rows :func:`list_audit` lists with the same filters (every page's total)."""
    return count_rows(session, _audit_query(entity_type, entity_id, actor, since, until))
