"""Reading the audit log (the CRUD modules write it)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db.models import AuditLog


def list_audit(
    session: Session,
    *,
    entity_type: str | None = None,
    entity_id: object | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> list[AuditLog]:
    """Audit rows, newest first."""
    query = select(AuditLog).order_by(AuditLog.at.desc(), AuditLog.id.desc()).limit(limit)
    if entity_type is not None:
        query = query.where(AuditLog.entity_type == entity_type)
    if entity_id is not None:
        query = query.where(AuditLog.entity_id == str(entity_id))
    if actor is not None:
        query = query.where(AuditLog.actor == actor)
    if since is not None:
        query = query.where(AuditLog.at >= since)
    return list(session.scalars(query))
