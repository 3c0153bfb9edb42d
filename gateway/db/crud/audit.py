"""Reading the audit log (the CRUD modules write it).

Filtered by ``actor`` (exactly as recorded) or by ``operator``: a named operator's changes
through the admin API (``admin-api:<operator>@<host>``) and the dashboard
(``admin-ui:<operator>``) together.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from gateway.db.crud.pages import count_rows, page
from gateway.db.models import AuditLog


def operator_actors(operator: str) -> Any:
    """The condition "made by named operator ``operator``" (API or dashboard)."""
    escaped = operator.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return or_(
        AuditLog.actor == f"admin-ui:{operator}",
        AuditLog.actor == f"admin-api:{operator}",
        AuditLog.actor.like(f"admin-api:{escaped}@%", escape="\\"),
    )


def _audit_query(
    entity_type: str | None,
    entity_id: object | None,
    actor: str | None,
    since: datetime | None,
    until: datetime | None,
    operator: str | None = None,
) -> Select[Any]:
    query = select(AuditLog)
    if operator is not None:
        query = query.where(operator_actors(operator))
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
    operator: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[AuditLog]:
    """Audit rows in ``[since, until)``, newest first (id breaks ties: stable pages)."""
    query = _audit_query(entity_type, entity_id, actor, since, until, operator).order_by(
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
    operator: str | None = None,
) -> int:
    """How many rows :func:`list_audit` lists with the same filters (every page's total)."""
    query = _audit_query(entity_type, entity_id, actor, since, until, operator)
    return count_rows(session, query)
